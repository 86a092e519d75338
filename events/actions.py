"""The actions a window's policy may ask for, as data: one msgspec struct per action, a tagged union.

`ActionRequested.request` (events/schema.py, schema v2) holds one of these; its tag, the `action`
field, is the action's name. Every executor (the runner's `Target`, the model run) holds one handler
per struct here, tested in tests/test_actions.py, and the policy can only ask for what decodes as one
of them: a misspelt action or a missing argument fails when it is asked for, never mid-window.
Logs written before v2 (`action` and `args` side by side) are lifted by the upcaster in schema.py.
"""

from __future__ import annotations

from typing import Any, Literal, Union, get_args

import msgspec


class Action(msgspec.Struct, tag_field="action", frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Base of every action; a subclass's tag is the action's name and is never renamed or reused."""

    @property
    def name(self) -> str:
        return self.__struct_config__.tag  # type: ignore[return-value]  # every action is declared with a str tag

    def args(self) -> dict[str, Any]:
        """The action's arguments as builtins (what an executor's handler and a report read)."""
        return msgspec.structs.asdict(self)


class ValidateFixtures(Action, tag="validate_fixtures", frozen=True):
    """The named fixtures' work as the planner reads it: per body its max_tokens, prompt size and hash."""

    fixtures: list[str]


class Snapshot(Action, tag="snapshot", frozen=True):
    """Records one part of the host as it is before anything changes: what the restore is checked against."""

    what: Literal["incumbent", "router", "monitoring", "gpu", "configuration"]


class RetainRecipe(Action, tag="retain_recipe", frozen=True):
    """Fetches a recipe's exact bytes from the recipe manager, checks their sha256 and keeps them
    (content-addressed): every later load, unload and the restore name that hash."""

    recipe: str | None
    role: Literal["incumbent", "candidate"]
    expect_sha256: str | None = None


class Preview(Action, tag="preview", frozen=True):
    """Asks the recipe manager what a load or unload would do, with no side effect (contract section 1)."""

    op: Literal["load", "unload"]
    recipe: str | None
    sha256: str | None
    role: Literal["incumbent", "candidate", "rollback"]


class Quiesce(Action, tag="quiesce", frozen=True):
    """Asks the router to stop sending new requests to this primary (it drains what it holds)."""


class Readmit(Action, tag="readmit", frozen=True):
    """Asks the router to send requests to this primary again."""


class Unload(Action, tag="unload", frozen=True):
    """Unloads the named recipe, by its retained sha256."""

    recipe: str | None
    sha256: str | None
    label: str | None = None


class Load(Action, tag="load", frozen=True):
    """Loads the named recipe, by its retained sha256: a new incarnation."""

    recipe: str | None
    sha256: str | None
    label: str | None = None


class ReadIdentity(Action, tag="read_identity", frozen=True):
    """Reads the serving engine's identity (build, recipe, incarnation), without generating."""


class ScrapeMetrics(Action, tag="scrape_metrics", frozen=True):
    """Reads the engine's /metrics: the counters and gauges the window's rules and cells read."""


class SetTrace(Action, tag="set_trace", frozen=True):
    """Turns the engine's request trace on or off (the trace arms)."""

    enabled: bool


class ManagerState(Action, tag="manager_state", frozen=True):
    """Reads the recipe manager's state: what is loaded, and its sha256."""


class Health(Action, tag="health", frozen=True):
    """Reads the engine's /health: ready with an incarnation loaded, or not."""


class Preflight(Action, tag="preflight", frozen=True):
    """One short request, sent directly to the engine or routed through the router, before the window
    relies on that path."""

    path: Literal["direct", "routed"]


class SendRequest(Action, tag="send_request", frozen=True):
    """Sends one fixture body, byte for byte, and measures its answer (`request_done` carries the outcome)."""

    phase: str
    fixture: str | None
    order_index: int
    body_index: int
    body_sha256: str


class SteadyState(Action, tag="steady_state", frozen=True):
    """The plan's steady-state guards evaluated once on the site's Prometheus: before the quiesce, and
    after the readmission (between them the runner's guard watch evaluates them on its own)."""

    when: Literal["before", "after"]
    queries: dict[str, str]  # guard name -> its PromQL


AnyAction = Union[ValidateFixtures, Snapshot, RetainRecipe, Preview, Quiesce, Readmit, Unload, Load,  # noqa: UP007
                  ReadIdentity, ScrapeMetrics, SetTrace, ManagerState, Health, Preflight, SendRequest, SteadyState]
ACTION_TYPES: tuple[type[AnyAction], ...] = get_args(AnyAction)  # the catalogue, in its documented order


def action_tag(cls: type[Action]) -> str:
    """The name an action type is requested and logged by (every action type declares a str tag)."""
    return str(cls.__struct_config__.tag)


BY_NAME: dict[str, type[AnyAction]] = {action_tag(t): t for t in ACTION_TYPES}


class UnknownAction(ValueError):
    """A request the catalogue does not know, or arguments it does not take: a bug in the policy."""


def make(name: str, args: dict[str, Any] | None = None) -> AnyAction:
    """The action `name` with `args`; UnknownAction unless it is in the catalogue and takes exactly those."""
    spec = BY_NAME.get(name)
    if spec is None:
        raise UnknownAction(f"action {name!r}: not one of {', '.join(sorted(BY_NAME))}")
    try:
        return msgspec.convert(args or {}, spec)
    except msgspec.ValidationError as exc:
        raise UnknownAction(f"action {name!r}: {exc}") from None
