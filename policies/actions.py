"""The actions a window's policy may ask for, each with the arguments it takes: the one catalogue that
every executor's handler table (the runner's Target, the model run) is held to (tests/test_actions.py).

A decision still travels as `ActionRequested(action, args)` so that every log ever written decodes;
the policy checks each request against this catalogue as it makes it, so a misspelt action or a
missing argument is a bug that fails at once in every test, never an action nobody carries out."""

from __future__ import annotations

from typing import Literal

import msgspec


class _Args(msgspec.Struct, forbid_unknown_fields=True):
    pass


class NoArgs(_Args):
    pass


class ValidateFixtures(_Args):
    fixtures: list[str]


class Snapshot(_Args):
    what: Literal["incumbent", "router", "monitoring", "gpu", "configuration"]


class RetainRecipe(_Args):
    recipe: str | None
    role: Literal["incumbent", "candidate"]
    expect_sha256: str | None = None


class Preview(_Args):
    op: Literal["load", "unload"]
    recipe: str | None
    sha256: str | None
    role: Literal["incumbent", "candidate", "rollback"]


class Recipe(_Args):
    recipe: str | None
    sha256: str | None
    label: str | None = None


class SetTrace(_Args):
    enabled: bool


class SendRequest(_Args):
    phase: str
    fixture: str | None
    order_index: int
    body_index: int
    body_sha256: str


class Preflight(_Args):
    path: Literal["direct", "routed"]


# action -> its arguments
ACTIONS: dict[str, type[_Args]] = {
    "validate_fixtures": ValidateFixtures,
    "snapshot": Snapshot,
    "retain_recipe": RetainRecipe,
    "preview": Preview,
    "quiesce": NoArgs,
    "readmit": NoArgs,
    "unload": Recipe,
    "load": Recipe,
    "read_identity": NoArgs,
    "scrape_metrics": NoArgs,
    "set_trace": SetTrace,
    "manager_state": NoArgs,
    "health": NoArgs,
    "preflight": Preflight,
    "send_request": SendRequest,
}


class UnknownAction(ValueError):
    """A request the catalogue does not know, or arguments it does not take: a bug in the policy."""


def check(action: str, args: dict) -> None:
    """Raises UnknownAction unless `action` is in the catalogue and `args` are what it takes."""
    spec = ACTIONS.get(action)
    if spec is None:
        raise UnknownAction(f"action {action!r}: not one of {', '.join(sorted(ACTIONS))}")
    try:
        msgspec.convert(args, spec)
    except msgspec.ValidationError as exc:
        raise UnknownAction(f"action {action!r}: {exc}") from None
