"""Steady-state guards in the policy: the plan's declaration, and what a breach does before the quiesce,
during the experiment, during the restore and after the readmission (tests/test_steady_state.py runs
them through the real runner against a real Prometheus)."""

from __future__ import annotations

import msgspec
import pytest

from flare_diag.events.schema import AbortDecided, ActionRequested, Alarm, RestorationRecorded, WindowClosed
from flare_diag.policies.plan import PlanError, plan_from_builtins
from flare_diag.policies.steady import Guard, selectors, worst
from flare_diag.policies.window import WindowPolicy
from tests.policy_world import World, decisions, drive, plan_builtins

QUERY = 'sum(rate(errors_total[1m])) / sum(rate(requests_total[1m]))'


def _plan(**guard) -> dict:
    plan = plan_builtins()
    plan["guards"] = [{"name": "routed-errors", "query": QUERY, "breach_if": ">", "threshold": 0.05,
                       "consecutive": 2, **guard}]
    return plan


def _run(world: World) -> list:
    return drive(WindowPolicy(), world, opened=lambda o: msgspec.structs.replace(o, steady_state=True))


def _breaching_after_quiesce(w: World, _name: str) -> float:
    return 0.5 if not w.admitted else 0.0


def test_a_guard_whose_query_is_not_promql_is_refused_naming_it():
    plan = _plan(query="sum(rate(errors_total[1m]")
    with pytest.raises(PlanError, match=r"guards\[0\]\.query: not valid PromQL"):
        plan_from_builtins(plan)


def test_two_guards_of_one_name_are_refused():
    plan = _plan()
    plan["guards"].append(dict(plan["guards"][0]))
    with pytest.raises(PlanError, match="is used twice"):
        plan_from_builtins(plan)


def test_a_guard_reads_every_series_its_query_names():
    assert selectors(QUERY) == ["errors_total", "requests_total"]


def test_several_series_are_judged_on_the_one_nearest_the_breach():
    up = Guard(name="g", query=QUERY, breach_if=">", threshold=1)
    down = Guard(name="g", query=QUERY, breach_if="<", threshold=1)
    assert worst(up, [0.2, 3.0, 1.0]) == 3.0 and worst(down, [0.2, 3.0]) == 0.2 and worst(up, []) is None


def test_a_pool_that_breaks_once_the_primary_leaves_aborts_steady_state_and_restores():
    world = World(_plan())
    world.pool = _breaching_after_quiesce
    h = _run(world)
    abort = decisions(h, AbortDecided)[0]
    assert abort.reason == "steady_state" and "for 2 consecutive evaluations" in abort.detail
    assert world.admitted and decisions(h, RestorationRecorded)[0].verified
    assert decisions(h, WindowClosed)[0].outcome == "aborted"


def test_one_breach_short_of_consecutive_does_not_abort():
    seen = {"n": 0}

    def once(w: World, _n: str) -> float:
        if w.admitted:
            return 0.0
        seen["n"] += 1
        return 0.5 if seen["n"] == 2 else 0.0  # one evaluation breached, the next ones not
    world = World(_plan())
    world.pool = once
    h = _run(world)
    assert not decisions(h, AbortDecided) and decisions(h, WindowClosed)[0].outcome == "completed"


def test_a_pool_already_unhealthy_is_aborted_before_anything_is_taken_down():
    world = World(_plan())
    world.pool = lambda _w, _n: 0.5
    h = _run(world)
    assert decisions(h, AbortDecided)[0].reason == "steady_state"
    assert "already unhealthy" in decisions(h, AbortDecided)[0].detail
    assert not [d for d in decisions(h, ActionRequested) if d.action in ("quiesce", "unload", "load")]


def test_a_dry_run_guard_says_once_what_it_would_have_done_and_never_aborts():
    world = World(_plan(dry_run=True))
    world.pool = _breaching_after_quiesce
    h = _run(world)
    said = [a for a in decisions(h, Alarm) if a.kind == "guard_dry_run"]
    assert len(said) == 1 and "would have aborted" in said[0].detail
    assert not decisions(h, AbortDecided) and decisions(h, WindowClosed)[0].outcome == "completed"


def test_a_guard_of_the_restore_only_alarms_and_the_primary_is_still_readmitted():
    world = World(_plan(during="restore"))
    world.pool = _breaching_after_quiesce
    h = _run(world)
    assert not decisions(h, AbortDecided)  # it does not guard the experiment
    assert [a for a in decisions(h, Alarm) if a.kind == "steady_state_during_restore"]
    assert world.admitted and decisions(h, RestorationRecorded)[0].verified


def test_a_guard_prometheus_never_answers_with_a_number_is_watch_lost():
    world = World(_plan())
    world.pool = lambda _w, _n: None
    h = _run(world)
    abort = decisions(h, AbortDecided)[0]
    assert abort.reason == "watch_lost" and "routed-errors" in abort.detail


def test_a_pool_that_has_not_recovered_after_the_readmission_is_an_alarm_not_a_failed_restore():
    world = World(_plan(during="experiment"))
    world.pool = lambda w, _n: 0.5 if w.incarnations >= 1 else 0.0  # breaks once the candidate loaded, stays broken
    h = _run(world)
    assert decisions(h, AbortDecided)[0].reason == "steady_state"
    assert [a for a in decisions(h, Alarm) if a.kind == "steady_state_after"]
    assert decisions(h, RestorationRecorded)[0].verified


def test_a_window_opened_without_prometheus_neither_evaluates_nor_depends_on_its_guards():
    world = World(_plan())
    world.pool = lambda _w, _n: 0.5
    h = drive(WindowPolicy(), world)  # steady_state=False: a model run's window
    assert not decisions(h, AbortDecided) and not [d for d in decisions(h, ActionRequested) if d.action == "steady_state"]


def test_rehearsing_a_plan_whose_guards_act_is_refused_naming_the_missing_prometheus(tmp_path):
    from flare_diag.daemon.reproducer.followon import _without_none
    from tests.simtools import flare_diag_here
    plan = tmp_path / "guarded.toml"
    plan.write_bytes(msgspec.toml.encode(_without_none(_plan())))
    rc, out, err = flare_diag_here("rehearse", "--plan", str(plan), "--out", str(tmp_path / "out"))
    assert rc == 2, out[-1000:] + err[-1000:]
    assert "guard.routed-errors" in err and "NOT READY" in err
    assert not (tmp_path / "out" / "log.db").exists()
