"""Every action the policy may ask for has exactly one handler in every executor, and nothing else does."""

from __future__ import annotations

import msgspec
import pytest

from flare_diag.events.actions import ACTION_TYPES, BY_NAME, Load, UnknownAction, make
from flare_diag.events.base import decode_payload
from flare_diag.events.schema import ActionRequested
from flare_diag.policies.window import WindowPolicy


def test_the_runners_target_carries_out_exactly_the_catalogues_actions(tmp_path):
    from flare_diag.daemon.hosts.site import sim_site
    from flare_diag.daemon.hosts.target import Target
    target = Target(sim_site("http://127.0.0.1:9", "t0ken"), {}, "")
    assert set(target.handlers()) == set(ACTION_TYPES)
    assert all(callable(h) for h in target.handlers().values())


def test_the_model_run_carries_actions_out_through_the_runners_own_handlers_on_the_host_models_ports():
    from pathlib import Path

    from flare_diag.daemon.hosts.actions import Actions
    from flare_diag.daemon.hosts.model import ModelManager, ModelServing
    from flare_diag.daemon.rehearsal.modelrun import ModelRun
    from flare_diag.daemon.simulator import load_scenario
    from flare_diag.daemon.window.setup import load_fixtures
    from flare_diag.policies.plan import decode_plan
    raw = (Path(__file__).resolve().parent.parent / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml").read_bytes()
    plan = decode_plan(raw)
    run = ModelRun(raw, plan, load_scenario("flare-47581cca"), load_fixtures(plan, []), 0)
    assert set(run.handlers()) == set(ACTION_TYPES)
    assert all(isinstance(getattr(h, "__self__", None), Actions) and h.__func__ is getattr(Actions, h.__name__)
               for h in run.handlers().values())  # the very methods the runner's Target inherits
    assert isinstance(run.actions.host.manager, ModelManager) and isinstance(run.actions.host.serving, ModelServing)


def test_every_action_type_has_a_name_of_its_own():
    assert len(BY_NAME) == len(ACTION_TYPES)


def test_a_misspelt_action_fails_when_the_policy_asks_for_it():
    with pytest.raises(UnknownAction, match="not one of"):
        WindowPolicy().request("scrape_metric", {})


def test_an_action_without_the_arguments_it_takes_fails_when_the_policy_asks_for_it():
    with pytest.raises(UnknownAction, match="snapshot"):
        make("snapshot", {"what": "everything"})
    with pytest.raises(UnknownAction, match="load"):
        make("load", {"recipe": "r"})


def test_an_action_requested_travels_as_its_typed_action():
    ev = ActionRequested(action_id=3, request=make("load", {"recipe": "r", "sha256": "s", "label": "A"}))
    raw = msgspec.json.decode(msgspec.json.encode(ev))
    assert raw["request"] == {"action": "load", "recipe": "r", "sha256": "s", "label": "A"}
    assert isinstance(ev.request, Load) and ev.action == "load" and ev.args["label"] == "A"


def test_a_version_1_action_requested_is_lifted_to_the_typed_action():
    v1 = msgspec.json.encode({"type": "action_requested", "action_id": 3, "action": "load",
                              "args": {"recipe": "r", "sha256": "s"}, "experimental": False, "deadline_s": 5.0})
    ev = decode_payload("action_requested", 1, v1)
    assert ev == ActionRequested(action_id=3, request=Load(recipe="r", sha256="s"), deadline_s=5.0)
