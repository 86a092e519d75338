"""Every host answer is a typed struct (events/answers.py), checked where it meets the window: an answer
of the wrong shape is the host's malformed answer, never read in part."""

from __future__ import annotations

import os

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flare_diag.events import actions as act
from flare_diag.events import answers
from flare_diag.events.reader import LogReader
from flare_diag.events.schema import AbortDecided, ActionDone, ActionRequested, RestorationRecorded, WatchObserved
from flare_diag.policies.window import WindowPolicy
from tests.policy_world import World, decisions, drive, plan_builtins

EXAMPLES = 5_000 if os.environ.get("FLARE_DIAG_SLOW") else 300
json_value = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                          max_leaves=12)
REQUESTS = [act.make("snapshot", {"what": w}) for w in ("incumbent", "router", "monitoring", "gpu", "configuration")] + [
    act.make(name, args) for name, args in [
        ("validate_fixtures", {"fixtures": ["c1-52"]}), ("retain_recipe", {"recipe": "r", "role": "incumbent"}),
        ("preview", {"op": "load", "recipe": "r", "sha256": "s", "role": "candidate"}), ("quiesce", {}), ("readmit", {}),
        ("unload", {"recipe": "r", "sha256": "s"}), ("load", {"recipe": "r", "sha256": "s"}), ("read_identity", {}),
        ("scrape_metrics", {}), ("set_trace", {"enabled": True}), ("manager_state", {}), ("health", {}),
        ("preflight", {"path": "direct"}), ("steady_state", {"when": "before", "queries": {"g": "up"}})]]
FIELDS = {"tensor_parallel": "two", "trace_enabled": "yes", "recipe_sha256": 7, "gpus": {"uuid": "GPU-0"}}


def test_every_action_but_a_generation_has_an_answer_struct():
    assert {type(r) for r in REQUESTS} == set(act.ACTION_TYPES) - {act.SendRequest}
    assert all(answers.answer_type(r) is not None for r in REQUESTS)
    assert answers.answer_type(act.make("send_request", {"phase": "p", "fixture": "f", "order_index": 0, "body_index": 0,
                                                         "body_sha256": "x"})) is None  # its outcome is a request_done


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.sampled_from(REQUESTS), json_value)
def test_any_json_as_any_actions_answer_decodes_or_is_the_hosts_malformed_answer_named(request, data):
    try:
        typed = answers.decode(request, data)
    except answers.UnexpectedAnswer as exc:
        assert str(exc).startswith(f"{request.name}: the answer is not ") and "\n" not in str(exc)
        return
    assert isinstance(typed, answers.answer_type(request))


@pytest.mark.parametrize("field,value", sorted(FIELDS.items()))
def test_an_identity_field_of_the_wrong_type_is_a_malformed_answer(field, value):
    good = {"image": "img", "tensor_parallel": 2, "trace_enabled": False, "gpus": [{"uuid": "GPU-0", "power_limit_w": 300}]}
    assert answers.decode(act.make("read_identity"), good) is not None
    with pytest.raises(answers.UnexpectedAnswer, match=rf"read_identity: the answer is not Identity \(.*{field}"):
        answers.decode(act.make("read_identity"), {**good, field: value})


def test_an_engines_own_identity_fields_decode_and_stay_in_the_answer():
    data = {"recipe": "r", "incarnation": "3", "engine_version": "0.11.0", "kv_block_size": 16}
    typed = answers.decode(act.make("read_identity"), data)
    assert isinstance(typed, answers.Identity) and typed.incarnation == "3"
    assert ActionDone(at_ns=0, action_id=1, ok=True, data=data).data["kv_block_size"] == 16  # the log keeps all of it


def test_an_incumbent_whose_identity_is_malformed_aborts_before_anything_is_taken_down():
    world = World(plan_builtins())
    world.identity_override = {"tensor_parallel": "two"}
    history = drive(WindowPolicy(), world)
    abort = decisions(history, AbortDecided)[0]
    assert "tensor_parallel" in abort.detail and "IncumbentSnapshot" in abort.detail, abort
    asked = [d.action for d in decisions(history, ActionRequested)]
    assert not {"quiesce", "unload", "load", "readmit"} & set(asked)


def test_the_decider_takes_an_answer_of_the_wrong_shape_as_a_failed_action_whoever_executed_it():
    said = ActionDone(at_ns=5, action_id=9, ok=True, data={"status": "200"})  # "200" is not 200, nor any number
    taken = WindowPolicy._decoded(said, answers.Health)
    assert (taken.ok, taken.error, taken.action_id) == (False, "malformed_transport", 9)
    assert "action 9: the answer is not Health" in taken.detail
    assert WindowPolicy._decoded(msgspec.structs.replace(said, data={"status": 200}), answers.Health).ok


def test_a_gpu_watch_answer_of_the_wrong_shape_is_the_watch_failing_not_a_view():
    policy = WindowPolicy()
    world = World(plan_builtins())
    xids = {"n": 0}

    def hook(w, hist):
        if w.requests_sent == 5 and not xids["n"]:
            xids["n"] = 1  # an Xid list that is not a list of Xids: never counted as seen
            return WatchObserved(at_ns=w.now, source="gpu", data={"xid_events": "79", "gpus": []})
        return None
    drive(policy, world, hook=hook)
    assert policy.state.watch_failure.get("gpu", "").startswith("malformed_transport: gpu watch: the answer is not GpuView")


def test_every_answer_a_rehearsal_logged_is_its_actions_struct(default_rehearsal):
    _rc, _report, out = default_rehearsal
    asked: dict[int, act.Action] = {}
    seen: set[type] = set()
    with LogReader(out / "log.db") as reader:
        for env in reader.iter(types=["action_requested", "action_done"]):
            ev = env.event()
            if isinstance(ev, ActionRequested):
                asked[ev.action_id] = ev.request
            elif isinstance(ev, ActionDone) and ev.ok:
                typed = answers.decode(asked[ev.action_id], ev.data)
                seen.add(type(typed))
    assert {answers.IncumbentSnapshot, answers.RouterView, answers.GpuView, answers.Identity, answers.MetricsSample,
            answers.ManagerState, answers.Incarnation, answers.RecipeKept, answers.Preview, answers.Preflight} <= seen


async def _window_on_a_host_whose_identity_says(drift: dict, tmp_path, plan_path) -> tuple[str, list, str | None]:
    from flare_diag.daemon.hosts.target import Target
    from flare_diag.daemon.window.runner import Runner
    from flare_diag.daemon.window.setup import WindowSetup, load_fixtures
    from flare_diag.events.store import EventStore
    from flare_diag.policies.plan import decode_plan
    from tests.simtools import served
    raw = plan_path.read_bytes()
    plan = decode_plan(raw)
    async with served() as (host, site):
        host.drift = dict(drift)  # what its identity endpoint answers besides the contract's fields
        setup = WindowSetup(raw, plan, site, load_fixtures(plan, []), rehearsal=True, accept_partial=True, clock="virtual")
        target = Target(setup.site, setup.fixtures, setup.plan_sha256)
        store = await EventStore.open(tmp_path / "log.db")
        outcome = await Runner(store, target, "w-typed").run(setup.opened("w-typed"))
        await target.close()
        await store.close()
        with LogReader(tmp_path / "log.db") as reader:
            events = [e.event() for e in reader.iter()]
        return outcome, events, host.engine.recipe if host.engine else None


def test_the_runner_logs_a_hosts_answer_of_the_wrong_shape_as_a_failed_action_and_changes_nothing(tmp_path, small_plan):
    from flare_diag.daemon.rehearsal import virtualtime
    outcome, events, loaded = virtualtime.run(_window_on_a_host_whose_identity_says({"tensor_parallel": "two"},
                                                                                     tmp_path, small_plan))
    asked = {e.action_id: e.request for e in events if isinstance(e, ActionRequested)}
    snap = next(e for e in events if isinstance(e, ActionDone) and isinstance(asked[e.action_id], act.Snapshot)
                and asked[e.action_id].what == "incumbent")
    assert (snap.ok, snap.error) == (False, "malformed_transport") and "tensor_parallel" in snap.detail, snap
    assert snap.data == {}  # nothing of the malformed answer is read, nor logged as an answer
    abort = next(e for e in events if isinstance(e, AbortDecided))
    assert abort.reason == "preflight" and "tensor_parallel" in abort.detail
    assert not {"quiesce", "unload", "load"} & {r.name for r in asked.values()} and loaded == "glm-incumbent"
    # an identity that never reads as one cannot verify the incumbent: a person must look, and says so;
    # the primary was never taken out of rotation
    rest = next(e for e in events if isinstance(e, RestorationRecorded))
    assert rest.checks["incumbent_sha256_match"] is False and rest.checks["readmitted"] is None
    assert outcome == "restore_failed"


async def _site_check_of_a_host_whose_identity_says(drift: dict, plan_path):
    from flare_diag.daemon.hosts.target import Target
    from flare_diag.daemon.window.setup import load_fixtures
    from flare_diag.daemon.window.sitecheck import check_site
    from flare_diag.policies.plan import decode_plan
    from tests.simtools import served
    plan = decode_plan(plan_path.read_bytes())
    async with served() as (host, site):
        host.drift = dict(drift)
        target = Target(site, load_fixtures(plan, []), "0" * 64)
        try:
            return await check_site(target, plan)
        finally:
            await target.close()


def test_site_check_refuses_an_identity_of_the_wrong_shape_as_the_window_would(small_plan):
    from flare_diag.daemon.rehearsal import virtualtime
    check = virtualtime.run(_site_check_of_a_host_whose_identity_says({"trace_enabled": "off"}, small_plan))
    ident = next(c for c in check.capabilities if c.name == "serving.identity")
    assert "identity: the answer is not Identity" in ident.reason and "$.trace_enabled" in ident.reason, ident
    assert "serving.identity" in check.missing
