"""The window policy, rule by rule (seed "Execution contract"), against an in-memory host."""

from __future__ import annotations

import msgspec
import pytest

from flare_diag.events.schema import (
    AbortDecided, ActionRequested, Alarm, CellRecorded, OperatorAbort, RequestDone, RestorationRecorded,
    RestoreStarted, TimeMarked, TraceOrderFrozen, VerdictReached, WatchObserved, WindowClosed,
)
from flare_diag.policies.window import WindowPolicy
from tests.policy_world import S, World, decisions, drive, plan_builtins


def run(world=None, hook=None, **timing):
    w = world or World(plan_builtins(**timing))
    h = drive(WindowPolicy(), w, hook)
    return w, h


def cells(h):
    return {c.phase: c for c in decisions(h, CellRecorded)}


def closed(h):
    return decisions(h, WindowClosed)[-1]


def actions(h):
    return [d for d in decisions(h, ActionRequested)]


def test_window_completes_and_restores_when_nothing_goes_wrong():
    _w, h = run()
    assert closed(h).outcome == "completed"
    assert decisions(h, RestorationRecorded)[0].verified


def test_snapshots_and_previews_come_before_the_incumbent_is_taken_down():
    _w, h = run()
    names = [(a.action, a.args.get("what") or a.args.get("op")) for a in actions(h)]
    first_unload = names.index(("unload", None))
    for needed in [("snapshot", "incumbent"), ("snapshot", "router"), ("snapshot", "monitoring"), ("snapshot", "gpu"),
                   ("snapshot", "configuration"), ("preview", "load"), ("preview", "unload"), ("quiesce", None)]:
        assert names.index(needed) < first_unload


def test_identity_phases_send_no_generation_request():
    _w, h = run()
    ident = [a for a in actions(h) if a.action == "send_request" and a.args["phase"].endswith("identity")]
    assert ident == [] and cells(h)["A.identity"].status == "measured"


def test_reverse_replay_sends_the_same_bodies_in_reverse_order():
    _w, h = run()
    sent = [a.args for a in actions(h) if a.action == "send_request"]
    fwd = [a["body_index"] for a in sent if a["phase"] == "A.forward_prime"]
    rev = [a["body_index"] for a in sent if a["phase"] == "A.reverse_replay"]
    assert fwd == list(range(52)) and rev == list(reversed(fwd))


def test_small_control_replays_the_last_twelve_bodies_twice_and_is_not_comparable():
    _w, h = run()
    sent = [a.args["body_index"] for a in actions(h) if a.action == "send_request" and a.args["phase"] == "B.small_control"]
    assert sent == list(range(40, 52)) * 2
    assert cells(h)["B.small_control"].comparable is False


def test_fresh_incarnation_b_is_loaded_before_its_phases():
    _w, h = run()
    acts = actions(h)
    loads = [i for i, a in enumerate(acts) if a.action == "load"]
    b_first = next(i for i, a in enumerate(acts) if a.action == "send_request" and a.args["phase"].startswith("B."))
    assert len([i for i in loads if i < b_first]) == 2


def test_trace_order_is_frozen_before_the_first_request():
    _w, h = run()
    flat = decisions(h)
    frozen = next(i for i, d in enumerate(flat) if isinstance(d, TraceOrderFrozen))
    first_req = next(i for i, d in enumerate(flat) if isinstance(d, ActionRequested) and d.action == "send_request")
    assert frozen < first_req


def test_phase_whose_estimated_end_passes_the_stop_minute_is_deferred_with_its_reason():
    _w, h = run(World(plan_builtins(), request_s=17))  # the B arm fits; not every optional trace arm
    c = cells(h)
    deferred = [p for p, x in c.items() if x.status == "deferred" and "would end at minute" in x.reason]
    assert deferred and all("past the stop minute 70" in c[p].reason for p in deferred)


def test_no_experimental_request_is_decided_at_or_after_the_stop_minute():
    _w, h = run(World(plan_builtins(), request_s=30))
    t0 = next(i.at_ns for i, ds in h if any(isinstance(d, TimeMarked) and d.mark == "t0" for d in ds))
    for inp, ds in h:
        if any(isinstance(d, ActionRequested) and d.experimental for d in ds):
            assert inp.at_ns < t0 + 70 * 60 * S


def _watches_then_tick(world, stop: int):
    """While one request hangs until past the stop minute: the watches answering every 5 s, then the
    runner's tick at the stop minute."""
    from flare_diag.events.schema import Tick
    t = world.now
    while t + 5 * S < stop:
        t += 5 * S
        world.now = t
        yield WatchObserved(at_ns=t, source="gpu", data={"xid_events": [], "gpus": []})
        yield WatchObserved(at_ns=t, source="router", data={"config_sha256": "router-1", "backend": {
            "id": "primary", "admitted": False, "inflight": 0}})
    world.now = stop
    yield Tick(at_ns=stop)


def test_restore_starts_at_the_stop_minute_and_cancels_in_flight_requests():
    from flare_diag.events.schema import CancelRequested
    state: dict = {}

    def hook(world, hist):  # the runner's tick at the stop minute arrives while a request is in flight
        if not state:
            sent = [d for d in hist[-1][1] if isinstance(d, ActionRequested) and d.action == "send_request"
                    and d.args["phase"] == "B.forward_replay" and d.args["order_index"] == 10]
            if not sent:
                return None
            t0 = next(i.at_ns for i, ds in hist if any(isinstance(d, TimeMarked) and d.mark == "t0" for d in ds))
            state.update(request=sent[0].action_id, inputs=_watches_then_tick(world, t0 + 70 * 60 * S))
        return next(state["inputs"], None)

    _w, h = run(hook=hook)
    assert state, "the hook never met B.forward_replay's request 10 in flight: this test tested nothing"
    started = decisions(h, RestoreStarted)[0]
    assert started.cause == "stop_minute"
    assert any(state["request"] in d.action_ids for d in decisions(h, CancelRequested))
    c = cells(h)["B.forward_replay"]
    assert c.status == "invalid" and "cut at the stop minute after 10 of 52 requests" in c.reason


def test_drain_that_does_not_settle_within_ten_seconds_invalidates_the_phase():
    w = World(plan_builtins())
    state = {"armed": False}

    def hook(world, hist):
        if not state["armed"] and any(isinstance(d, CellRecorded) and d.phase == "A.forward_prime" for _i, ds in hist for d in ds):
            world.drain_stuck = True
            state["armed"] = True
        return None

    _w, h = run(w, hook)
    c = cells(h)["A.reverse_replay"]
    assert c.status == "invalid" and "did not settle within 10 s" in c.reason


def test_counters_not_reset_on_a_fresh_incarnation_invalidate_its_cells():
    w = World(plan_builtins())
    orig = w.answer

    def answer(d):
        r = orig(d)
        if d.action == "load" and d.args.get("label") == "B":
            w.counters["host_lookups"] = 7
        return r

    w.answer = answer
    _w, h = run(w)
    c = cells(h)
    assert c["B.identity"].status == "invalid" and "not reset" in c["B.identity"].reason
    assert c["B.forward_replay"].status == "invalid"


def _abort_case(error: str, nth_request: int = 10):
    w = World(plan_builtins())
    w.request_error[nth_request] = error
    return run(w)


def test_authentication_failure_aborts_and_restores():
    _w, h = _abort_case("authentication")
    assert decisions(h, AbortDecided)[0].reason == "authentication"
    assert closed(h).outcome == "aborted" and decisions(h, RestorationRecorded)[0].verified


def test_malformed_transport_aborts():
    _w, h = _abort_case("malformed_transport")
    assert decisions(h, AbortDecided)[0].reason == "malformed_transport"


def test_cuda_error_and_oom_abort_as_gpu_fault():
    for err in ("cuda_error", "out_of_memory"):
        _w, h = _abort_case(err)
        assert decisions(h, AbortDecided)[0].reason == "gpu_fault"


def test_xid_event_aborts_as_gpu_fault():
    sent = {"n": 0}

    def hook(world, hist):
        if world.requests_sent == 5 and not sent["n"]:
            sent["n"] = 1
            return WatchObserved(at_ns=world.now, source="gpu", data={"xid_events": [{"gpu": "GPU-0", "xid": 79}]})
        return None

    _w, h = run(hook=hook)
    assert decisions(h, AbortDecided)[0].reason == "gpu_fault"


def test_identity_drift_in_metrics_labels_aborts():
    def hook(world, hist):
        if world.requests_sent == 3:
            world.identity_override = {"image": "deadbeef"}
        return None

    _w, h = run(hook=hook)
    assert decisions(h, AbortDecided)[0].reason == "identity_drift"


def test_incumbent_identity_not_matching_the_contract_refuses_before_take_down():
    w = World(plan_builtins())
    w.identity_override = {"draft_tokens": 3}
    _w, h = run(w)
    ab = decisions(h, AbortDecided)[0]
    assert ab.reason == "preflight" and ab.detail.startswith("identity_drift: ") and "before anything was taken down" in ab.detail
    assert not [a for a in actions(h) if a.action in ("unload", "quiesce", "readmit", "load")]
    assert not [a for a in decisions(h, Alarm) if a.kind == "primary_left_quiesced"]


def test_a_window_whose_incumbent_is_the_candidate_refuses_before_take_down():
    w = World(plan_builtins())
    w.loaded = {"recipe": "glm-candidate", "sha256": "cand-sha", "incarnation": "i0"}
    _w, h = run(w)
    ab = decisions(h, AbortDecided)[0]
    assert ab.reason == "preflight" and "is the plan's candidate" in ab.detail
    assert not [a for a in actions(h) if a.action in ("unload", "quiesce", "load")]


def test_after_a_failed_restore_only_the_recorded_incumbent_is_taken_for_the_incumbent():
    w = World(plan_builtins())
    w.loaded = {"recipe": "glm-incumbent", "sha256": "another-sha", "incarnation": "i0"}
    h = drive(WindowPolicy(), w, opened=lambda o: msgspec.structs.replace(o, expected_incumbent_sha256="inc-sha"))
    ab = decisions(h, AbortDecided)[0]
    assert ab.reason == "preflight" and "not the incumbent" in ab.detail
    assert not [a for a in actions(h) if a.action in ("unload", "quiesce", "load")]


def test_a_fault_during_the_restore_blocks_readmission_and_fails_the_restoration():
    sent = []

    def hook(world, history):
        restoring = any(isinstance(d, RestoreStarted) for _i, ds in history for d in ds)
        if restoring and not sent:
            sent.append(True)
            return WatchObserved(at_ns=world.now, source="gpu", data={"xid_events": [{"gpu": "GPU-0", "xid": 79}], "gpus": []})
        if not restoring and world.requests_sent == 3 and not sent:
            return OperatorAbort(at_ns=world.now, reason="test") if not any(
                isinstance(i, OperatorAbort) for i, _ in history) else None
        return None
    _w, h = run(hook=hook)
    rest = decisions(h, RestorationRecorded)[0]
    assert rest.checks["no_fault_during_restore"] is False and rest.checks["readmitted"] is False and not rest.verified
    assert {a.kind for a in decisions(h, Alarm)} >= {"fault_during_restore", "primary_left_quiesced"}
    assert not [a for a in actions(h) if a.action == "readmit"]
    assert closed(h).outcome == "restore_failed"


def test_a_restore_that_ends_past_the_window_end_does_not_verify():
    pol = WindowPolicy()

    def abort_at_the_last_moment(world, history):
        if world.requests_sent == 3 and not any(isinstance(i, OperatorAbort) for i, _ in history):
            world.now = pol.state.t0 + int(89.9 * 60 * S)  # the restore's 60-s load cannot end by minute 90
            return OperatorAbort(at_ns=world.now, reason="late")
        return None
    h = drive(pol, World(plan_builtins()), abort_at_the_last_moment)
    rest = decisions(h, RestorationRecorded)[0]
    assert rest.checks["within_reservation"] is False and not rest.verified
    assert closed(h).outcome == "restore_failed"



def test_containment_breach_reported_by_the_router_aborts():
    def hook(world, hist):
        if world.requests_sent == 4 and not any(isinstance(i, WatchObserved) and i.data.get("backend", {}).get("inflight")
                                                for i, _ in hist):
            return WatchObserved(at_ns=world.now, source="router",
                                 data={"config_sha256": "router-1", "backend": {"id": "primary", "admitted": True, "inflight": 2}})
        return None

    _w, h = run(hook=hook)
    assert decisions(h, AbortDecided)[0].reason == "containment"


@pytest.mark.parametrize(("admitted", "inflight", "words"), [
    (True, 2, "is receiving traffic"), (False, 1, "is receiving traffic"),
    (True, 0, "is admitted again, so the router may send it traffic"),
    (True, None, "is admitted again, so the router may send it traffic")])
def test_a_containment_breach_says_traffic_only_when_requests_were_seen_in_flight(admitted, inflight, words):
    from flare_diag.policies import guards
    from flare_diag.policies.plan import Growth
    ctx = guards.Context(Growth(), None, {"config_sha256": "router-1"})
    hit = guards.judge("router", {"config_sha256": "router-1",
                                  "backend": {"id": "primary", "admitted": admitted, "inflight": inflight}}, ctx)
    assert hit is not None and hit[0] == "containment" and f"quiesced backend primary {words} " in hit[1], hit


def test_uncontrolled_growth_aborts():
    def hook(world, hist):
        if world.requests_sent == 6:
            world.gauges["resident_bytes"] = 10**15
        return None

    _w, h = run(hook=hook)
    assert decisions(h, AbortDecided)[0].reason == "uncontrolled_growth"


def test_operator_abort_ends_in_restore():
    def hook(world, hist):
        if world.requests_sent == 2 and not any(isinstance(i, OperatorAbort) for i, _ in hist):
            return OperatorAbort(at_ns=world.now, reason="pager", uid=0, pid=1)
        return None

    _w, h = run(hook=hook)
    assert decisions(h, AbortDecided)[0].reason == "operator"
    assert decisions(h, RestoreStarted)[0].cause == "abort"


def test_an_input_the_decider_has_no_rule_for_aborts_and_restores_and_no_cell_names_a_cause():
    from flare_diag.events.schema import Input

    class Unforeseen(Input, tag="unforeseen_test_input", frozen=True):
        """An observation no rule of the decider was written for (a newer daemon's, a bug's)."""

    def hook(world, hist):
        if world.requests_sent == 3 and not any(isinstance(i, Unforeseen) for i, _ in hist):
            return Unforeseen(at_ns=world.now)
        return None

    _w, h = run(hook=hook)
    abort = decisions(h, AbortDecided)[0]
    assert abort.reason == "unexpected_input" and "Unforeseen" in abort.detail
    assert [a.kind for a in decisions(h, Alarm)] == ["unexpected_input"]
    assert decisions(h, RestoreStarted)[0].cause == "abort" and decisions(h, RestorationRecorded)[0].verified
    verdict = decisions(h, VerdictReached)[0]
    assert verdict.hypothesis == "inconclusive" and "no cause is named" in verdict.basis


def test_natural_output_failures_are_recorded_and_never_abort():
    _w, h = run()
    assert not decisions(h, AbortDecided)
    assert cells(h)["A.forward_prime"].natural_failures > 0


def test_no_request_is_sent_after_an_abort():
    _w, h = _abort_case("authentication", nth_request=20)
    flat = decisions(h)
    ab = next(i for i, d in enumerate(flat) if isinstance(d, AbortDecided))
    assert not [d for d in flat[ab:] if isinstance(d, ActionRequested) and d.experimental]


def test_interrupted_phase_is_invalid_and_later_phases_required_or_optional_are_failed_with_the_abort_named():
    _w, h = _abort_case("authentication", nth_request=60)
    c = cells(h)
    assert c["A.reverse_replay"].status == "invalid" and "after 7 of 52" in c["A.reverse_replay"].reason
    # contract 4 (amended 2026-12-03): `failed` for a cell an abort left out, `deferred` only for time or order
    assert c["B.forward_prime"].status == "failed" and "aborted (authentication)" in c["B.forward_prime"].reason
    assert c["B.small_control"].status == "failed" and "aborted (authentication)" in c["B.small_control"].reason


def test_later_conditional_stages_are_deferred_with_their_admission_condition():
    _w, h = run()
    c = cells(h)
    assert c["nsight_capture"].status == "deferred" and "capture overhead" in c["nsight_capture"].reason
    assert c["kernel_replay"].status == "deferred"


def test_restore_loads_the_exact_incumbent_bytes_by_sha256():
    _w, h = run()
    loads = [a for a in actions(h) if a.action == "load"]
    assert loads[-1].args["sha256"] == "inc-sha"


def test_failed_incumbent_load_ends_restore_failed():
    w = World(plan_builtins())
    orig = w.answer

    def answer(d):
        if d.action == "load" and d.args.get("label") == "incumbent":
            w.fail["load"] = "engine_error"
        return orig(d)

    w.answer = answer
    _w, h = run(w)
    assert closed(h).outcome == "restore_failed"
    assert decisions(h, RestorationRecorded)[0].checks["incumbent_sha256_match"] is False


def _failing_in_restore(action: str, error: str = "engine_error", **match):
    """A world where `action` (with args `match`) fails once the restore has begun."""
    w = World(plan_builtins())
    orig = w.answer
    restoring = []

    def answer(d):
        if d.action == "manager_state":
            restoring.append(True)  # the restore path's first action
        if restoring and d.action == action and all(d.args.get(k) == v for k, v in match.items()):
            w.fail[action] = error
        return orig(d)

    w.answer = answer
    return w


def test_a_restore_whose_incumbent_did_not_load_leaves_the_primary_quiesced_with_an_alarm():
    _w, h = run(_failing_in_restore("load", label="incumbent"))
    assert not [a for a in actions(h) if a.action == "readmit"]
    checks = decisions(h, RestorationRecorded)[0].checks
    assert checks["readmitted"] is False and checks["routed_preflight"] is False
    alarm = next(a for a in decisions(h, Alarm) if a.kind == "primary_left_quiesced")
    assert "incumbent_sha256_match" in alarm.detail


def test_a_restore_whose_direct_preflight_fails_leaves_the_primary_quiesced():
    _w, h = run(_failing_in_restore("preflight", path="direct"))
    assert not decisions(h, AbortDecided)  # the experiments ran; only the restore's check failed
    assert not [a for a in actions(h) if a.action == "readmit"]
    assert closed(h).outcome == "restore_failed"
    assert "direct_preflight" in next(a for a in decisions(h, Alarm) if a.kind == "primary_left_quiesced").detail


def test_a_verified_restore_readmits_the_primary_before_the_routed_preflight():
    _w, h = run()
    names = [(a.action, a.args.get("path")) for a in actions(h)]
    assert names.index(("readmit", None)) < names.index(("preflight", "routed"))
    assert not [a for a in decisions(h, Alarm) if a.kind == "primary_left_quiesced"]


def test_restore_running_past_the_window_end_raises_an_alarm():
    w = World(plan_builtins())
    orig = w.answer

    def answer(d):
        r = orig(d)
        if d.action == "manager_state":
            w.now += 30 * 60 * S
            r = type(r)(**{**{f: getattr(r, f) for f in r.__struct_fields__}, "at_ns": w.now})
        return r

    w.answer = answer
    _w, h = run(w)
    assert [a.kind for a in decisions(h, Alarm)] == ["restore_overrun"]


def test_verdict_is_row_checkpoint_churn_when_reverse_restores():
    _w, h = run()
    assert decisions(h, VerdictReached)[0].hypothesis == "row_checkpoint_churn"


def test_verdict_is_key_or_checkpoint_eligibility_when_nothing_restores():
    _w, h = run(World(plan_builtins(), reuse_on=set()))
    assert decisions(h, VerdictReached)[0].hypothesis == "key_or_checkpoint_eligibility"


def test_verdict_is_not_reproduced_when_forward_forward_restores():
    _w, h = run(World(plan_builtins(), reuse_on={"B.forward_replay"}))
    assert decisions(h, VerdictReached)[0].hypothesis == "not_reproduced"


def test_verdict_is_inconclusive_when_reverse_replay_is_not_measured():
    _w, h = _abort_case("authentication", nth_request=3)
    assert decisions(h, VerdictReached)[0].hypothesis == "inconclusive"


def test_outcome_for_a_request_nobody_waits_for_changes_nothing():
    pol = WindowPolicy()
    w = World(plan_builtins())
    drive(pol, w)
    assert pol.receive(RequestDone(at_ns=10**15, action_id=99999, phase="x", order_index=0, body_index=0,
                                   body_sha256="", outcome="ok")) == []


# --- contract section 4 as amended 2026-11-29 -------------------------------------------------

def test_a_window_that_leaves_a_required_cell_unmeasured_closes_partial_and_says_which():
    _w, h = run(World(plan_builtins(), request_s=22))
    c = cells(h)
    assert c["B.forward_replay"].status != "measured"
    assert closed(h).outcome == "partial"
    basis = decisions(h, VerdictReached)[0].basis
    assert "Required cells not measured" in basis and "B.forward_replay" in basis


def test_an_arm_whose_required_phases_do_not_fit_is_not_started_at_all():
    # 22 s a request: A fits, but B's prime and replay together would pass minute 70 by the estimate
    _w, h = run(World(plan_builtins(), request_s=22))
    c = cells(h)
    assert c["B.forward_prime"].status == c["B.forward_replay"].status == "deferred"
    assert "arm B" in c["B.forward_prime"].reason
    loads = [a for a in actions(h) if a.action == "load" and a.args.get("label") == "B"]
    assert loads == []  # no primary downtime spent priming an arm whose replay could not run


def test_reverse_reuse_without_the_replay_order_control_is_inconclusive_with_next_step_run_the_b_arm():
    _w, h = run(World(plan_builtins(), request_s=22))
    v = decisions(h, VerdictReached)[0]
    assert v.hypothesis == "inconclusive"
    assert "B.forward_replay was not measured" in v.basis and v.next_experiment.startswith("Run the B arm")


def test_a_failed_incumbent_unload_aborts_into_restore():
    w = World(plan_builtins())
    w.fail["unload"] = "http_500"
    _w, h = run(w)
    assert decisions(h, AbortDecided)[0].detail.startswith("incumbent unload failed")
    assert closed(h).outcome == "aborted"
    assert not [a for a in actions(h) if a.action == "load" and a.args.get("label") in ("A", "B")]


def test_the_small_control_runs_without_waiting_on_an_earlier_result():
    _w, h = run()
    assert cells(h)["B.small_control"].status == "measured"


def test_a_trace_toggle_that_changes_more_than_trace_enabled_aborts_with_identity_drift():
    w = World(plan_builtins(window_min=200, stop_min=170))
    state = {"armed": False}

    def hook(world, hist):
        if not state["armed"] and any(isinstance(d, CellRecorded) and d.phase == "B.small_control" for _i, ds in hist for d in ds):
            world.identity_override = {"image": "0badc0de"}
            state["armed"] = True
        return None

    _w, h = run(w, hook)
    ab = decisions(h, AbortDecided)[0]
    assert ab.reason == "identity_drift" and "trace" in ab.detail


def test_a_closing_drain_that_crosses_the_stop_minute_does_not_invalidate_a_finished_phase():
    w = World(plan_builtins())
    state = {"armed": False}

    def hook(world, hist):
        # all of B.forward_replay's requests answered: the clock jumps to just before minute 70 and
        # the closing drain runs across it
        done = [d for _i, ds in hist for d in ds if isinstance(d, ActionRequested) and d.action == "send_request"
                and d.args["phase"] == "B.forward_replay"]
        answered = sum(1 for i, _ds in hist if isinstance(i, RequestDone) and i.phase == "B.forward_replay")
        if not state["armed"] and len(done) == 52 and answered == 52:
            t0 = next(i.at_ns for i, ds in hist if any(isinstance(d, TimeMarked) and d.mark == "t0" for d in ds))
            world.now = max(world.now, t0 + 70 * 60 * S - int(0.3 * S))
            state["armed"] = True
        return None

    _w, h = run(w, hook)
    c = cells(h)["B.forward_replay"]
    assert c.status == "measured" and "after the stop minute" in c.reason
    assert decisions(h, RestoreStarted)[0].cause == "stop_minute"


# --- arms, estimates and trace pairs (issue 12) ------------------------------------------------

def test_trace_arms_run_as_whole_off_on_pairs_in_the_frozen_order():
    from flare_diag.events.schema import PhaseStarted
    _w, h = run(roomy := World(plan_builtins(window_min=200, stop_min=170)))
    frozen = decisions(h, TraceOrderFrozen)[0].order
    ran = [d.phase for d in decisions(h, PhaseStarted) if d.phase in frozen]
    assert ran == frozen
    assert roomy is not None


def test_a_trace_pair_that_does_not_fit_ends_the_frozen_order_and_no_pair_is_left_half_run():
    _w, h = run(World(plan_builtins(), request_s=14))
    c = cells(h)
    frozen = decisions(h, TraceOrderFrozen)[0].order
    status = [c[p].status for p in frozen]
    assert "deferred" in status and "measured" in status
    first_deferred = status.index("deferred")
    assert first_deferred % 2 == 0  # a whole pair
    assert all(s == "deferred" for s in status[first_deferred:])


def test_the_trace_warm_up_runs_before_the_first_trace_arm_so_none_meets_a_cold_cache():
    from flare_diag.events.schema import PhaseStarted
    _w, h = run(World(plan_builtins(window_min=200, stop_min=170)))
    order = [d.phase for d in decisions(h, PhaseStarted)]
    assert order.index("trace.warmup") + 1 == order.index("trace.C1.r1.off")
    assert "not evidence" in cells(h)["trace.warmup"].reason


def test_only_the_small_control_carries_the_non_fresh_caveat():
    _w, h = run(World(plan_builtins(window_min=200, stop_min=170)))
    c = cells(h)
    assert "non-fresh initial state" in c["B.small_control"].reason
    trace = [p for p in c if p.startswith("trace.C")]
    assert trace and not any("non-fresh" in c[p].reason for p in trace)
    assert all("descriptive" in c[p].reason for p in trace)


def test_each_phase_estimate_is_revised_from_the_requests_before_it():
    from flare_diag.events.schema import PhaseStarted
    # the rate model says about 16 s a request; the host takes 8: B's estimate follows A's actuals
    _w, h = run(World(plan_builtins(), request_s=8))
    c = cells(h)
    a = c["A.forward_prime"]
    b = c["B.forward_replay"]
    first_err = abs(a.ended_minute - a.estimated_end_minute)
    later_err = abs(b.ended_minute - b.estimated_end_minute)
    assert later_err < first_err / 4
    assert decisions(h, PhaseStarted)


def test_a_projected_overrun_raises_an_alarm_while_the_required_cells_still_run():
    w = World(plan_builtins(), request_s=12)

    def slow_down(world, hist):
        if world.requests_sent == 30:
            world.request_s = 30  # the host slows during A.forward_prime
        return None

    _w, h = run(w, hook=slow_down)
    alarms = [a for a in decisions(h, Alarm) if a.kind == "projected_overrun"]
    assert alarms and "past the stop minute 70" in alarms[0].detail
    assert closed(h).outcome == "partial"


def test_an_optional_arm_never_loads_an_incarnation_its_own_arm_did_not_verify():
    _w, h = run(World(plan_builtins(), request_s=22))
    c = cells(h)
    assert c["B.identity"].status == "deferred"
    assert c["trace.C1.r1.off"].status == "deferred" and "not loaded" in c["trace.C1.r1.off"].reason


# --- watches (issue 13) ------------------------------------------------------------------------

def test_a_gpu_watch_silent_past_the_plan_s_limit_aborts_with_watch_lost():
    w = World(plan_builtins())

    def mute(world, hist):
        if world.requests_sent == 5:
            world.watch_silent.add("gpu")
        return None

    _w, h = run(w, hook=mute)
    ab = decisions(h, AbortDecided)[0]
    assert ab.reason == "watch_lost" and "GPU watch" in ab.detail and "30 s" in ab.detail
    assert decisions(h, RestorationRecorded)[0].verified


def test_a_router_watch_that_never_answers_aborts_with_watch_lost_soon_after_quiesce():
    w = World(plan_builtins())
    w.watch_silent.add("router")
    _w, h = run(w)
    ab = decisions(h, AbortDecided)[0]
    assert ab.reason == "watch_lost" and "router" in ab.detail and ab.minute < 1.5


def test_gpu_memory_over_its_fraction_in_a_routine_gpu_view_aborts_as_uncontrolled_growth():
    def hook(world, hist):
        if world.requests_sent == 3 and not any(isinstance(i, WatchObserved) and i.data.get("gpus", [{}])[0].get("memory_used_bytes") == 999
                                                for i, _ in hist):
            return WatchObserved(at_ns=world.now, source="gpu", data={"xid_events": [], "gpus": [
                {"uuid": "GPU-0", "memory_used_bytes": 999, "memory_total_bytes": 1000}]})
        return None

    _w, h = run(hook=hook)
    ab = decisions(h, AbortDecided)[0]
    assert ab.reason == "uncontrolled_growth" and "GPU" in ab.detail


def test_resident_memory_growing_past_its_bound_since_the_incarnation_loaded_aborts():
    w = World(plan_builtins())
    orig = w.answer

    def answer(d):
        r = orig(d)
        if d.action == "scrape_metrics":
            w.gauges["resident_bytes"] += 2**30  # a gibibyte a scrape
        return r

    w.answer = answer
    _w, h = run(w)
    ab = decisions(h, AbortDecided)[0]
    assert ab.reason == "uncontrolled_growth" and "since the incarnation's first observation" in ab.detail


def test_a_scheduler_queue_above_the_window_s_own_requests_for_three_scrapes_aborts():
    w = World(plan_builtins())
    state = {"scrapes": 0}
    orig = w.answer

    def answer(d):
        if d.action == "scrape_metrics" and w.requests_sent >= 3:
            state["scrapes"] += 1
            w.gauges["requests_pending"] = 50 * state["scrapes"]
        return orig(d)

    w.answer = answer
    _w, h = run(w)
    ab = decisions(h, AbortDecided)[0]
    assert ab.reason == "uncontrolled_growth" and "scheduler queue" in ab.detail


def _unsupported_at(n: int):
    sent = []

    def hook(world, history):
        if len(history) >= n and not sent:
            sent.append(True)
            return WatchObserved(at_ns=world.now, source="gpu", data={
                "xid_events": [], "gpus": [{"uuid": "GPU-0", "memory_used_bytes": 1, "memory_total_bytes": 2}],
                "unsupported": ["GPU-0: Xid events: NVML_ERROR_NOT_SUPPORTED"]})
        return None
    return hook


def test_a_production_window_whose_xid_watch_is_unsupported_aborts_watch_lost_naming_the_rule():
    _w, h = run(hook=_unsupported_at(60))
    ab = decisions(h, AbortDecided)
    assert ab and ab[0].reason == "watch_lost" and "gpu_fault (Xid) disabled" in ab[0].detail
    assert [a.kind for a in decisions(h, Alarm) if a.kind == "rule_disabled"] == ["rule_disabled"]


def test_a_non_production_window_goes_on_with_the_disabled_rule_named_in_an_alarm():
    plan = plan_builtins()
    plan["production"] = False
    _w, h = run(World(plan), hook=_unsupported_at(60))
    assert not decisions(h, AbortDecided) and closed(h).outcome == "completed"
    alarms = [a for a in decisions(h, Alarm) if a.kind == "rule_disabled"]
    assert len(alarms) == 1 and "NVML_ERROR_NOT_SUPPORTED" in alarms[0].detail


def test_every_restore_action_is_bounded_by_what_is_left_of_the_restore_budget():
    plan = plan_builtins(restore_budget_min=3.0)
    plan["rates"]["load_s"] = 30.0

    sent = []

    def operator_abort(world, history):
        if len(history) >= 80 and not sent:
            sent.append(True)
            return OperatorAbort(at_ns=world.now, reason="test")
        return None
    _w, h = run(World(plan), hook=operator_abort)
    restore_at = next(i for i, (_inp, ds) in enumerate(h) if any(isinstance(d, RestoreStarted) for d in ds))
    started_ns = h[restore_at][0].at_ns
    for inp, ds in h[restore_at:]:
        for d in ds:
            if isinstance(d, ActionRequested):
                left_s = (started_ns + 3 * 60 * S - inp.at_ns) / S
                assert d.deadline_s <= max(left_s, 0.001) + 1e-9, (d.action, d.deadline_s, left_s)
    assert closed(h).outcome == "aborted"


def test_an_engine_that_stops_answering_mid_phase_aborts_engine_lost():
    w = World(plan_builtins())
    w.request_error = {n: "http_503" for n in range(6, 400)}
    w.engine_down = True
    _w, h = run(w)
    ab = decisions(h, AbortDecided)[0]
    assert ab.reason == "engine_lost" and "http_503" in ab.detail and "/health answered 503" in ab.detail
    sent = [a for a in actions(h) if a.action == "send_request"]
    assert len(sent) == 6  # the failed request was the last one sent


def test_an_engine_whose_core_died_answering_500s_and_health_503_aborts_engine_lost_at_the_first_failure():
    # vLLM once its EngineCore is dead: the request in flight ends with an error event, the next ones get
    # HTTP 500 from the API server that is still up, and /health answers 503 (EngineDeadError)
    w = World(plan_builtins())
    w.request_error = {6: "engine_error", **{n: "http_500" for n in range(7, 400)}}
    w.engine_down = True
    _w, h = run(w)
    ab = decisions(h, AbortDecided)[0]
    assert ab.reason == "engine_lost" and "failed with engine_error and /health answered 503" in ab.detail, ab
    assert len([a for a in actions(h) if a.action == "send_request"]) == 6


def test_a_500_from_an_engine_whose_health_is_good_fails_the_cell_without_an_abort():
    w = World(plan_builtins())
    w.request_error = {6: "http_500"}
    _w, h = run(w)
    assert not decisions(h, AbortDecided)
    assert cells(h)["A.forward_prime"].status == "failed"


def test_a_503_from_an_engine_whose_health_is_good_fails_the_cell_without_an_abort():
    w = World(plan_builtins())
    w.request_error = {6: "http_503"}
    _w, h = run(w)
    assert not decisions(h, AbortDecided)
    assert cells(h)["A.forward_prime"].status == "failed"


def test_the_backend_seen_admitted_while_its_readmit_is_in_flight_is_no_breach():
    sent = []

    def admitted_before_the_reply(world, history):
        last = history[-1][1] if history else []
        if not sent and any(isinstance(d, ActionRequested) and d.action == "readmit" for d in last):
            sent.append(True)  # the router took the readmit before its reply came back
            return WatchObserved(at_ns=world.now, source="router",
                                 data={"config_sha256": "router-1", "backend": {"id": "primary", "admitted": True, "inflight": 0}})
        return None
    _w, h = run(hook=admitted_before_the_reply)
    assert sent
    rest = decisions(h, RestorationRecorded)[0]
    assert rest.verified and rest.checks["no_fault_during_restore"] is True
    assert not [a for a in decisions(h, Alarm) if a.kind == "fault_during_restore"]


# --- identity held through every phase, chained validity (issue 25) ---------------------------

def _drift_after(phase: str, n: int, change: dict):
    def hook(world, hist):
        sent = sum(1 for i, _ds in hist if isinstance(i, RequestDone) and i.phase == phase)
        if sent >= n and not world.identity_override:
            world.identity_override = dict(change)
            world.drift_at_request = sent
        return None
    return hook


def test_an_identity_field_drifting_mid_phase_at_c1_aborts_within_one_request():
    for change in ({"tensor_parallel": 1}, {"draft_tokens": 3}, {"host_cache_bytes": 2**34}, {"capture_enabled": True},
                   {"gpus": [{"uuid": "GPU-0", "power_limit_w": 300}, {"uuid": "GPU-1", "power_limit_w": 250}]},
                   {"gpus": [{"uuid": "GPU-0", "power_limit_w": 300}, {"uuid": "GPU-9", "power_limit_w": 300}]}):
        w, h = run(hook=_drift_after("A.forward_prime", 10, change))
        ab = decisions(h, AbortDecided)
        assert ab and ab[0].reason == "identity_drift", change
        sent = [a for a in actions(h) if a.action == "send_request" and a.args["phase"] == "A.forward_prime"]
        assert len(sent) <= w.drift_at_request + 1, change
        c = cells(h)
        assert c["A.forward_prime"].status == "invalid" and c["A.forward_prime"].identity_held is False
        assert decisions(h, VerdictReached)[0].hypothesis == "inconclusive"


def test_a_candidate_on_other_gpus_than_the_incumbent_is_identity_drift():
    def hook(world, hist):
        if world.incarnations >= 1 and not world.identity_override:
            world.identity_override = {"gpus": [{"uuid": "GPU-7", "power_limit_w": 300},
                                                {"uuid": "GPU-1", "power_limit_w": 300}]}
        return None
    _w, h = run(hook=hook)
    ab = decisions(h, AbortDecided)
    assert ab[0].reason == "identity_drift" and "incumbent" in ab[0].detail


def test_a_replay_whose_prime_drain_did_not_settle_is_invalid_and_never_sent():
    def hook(world, hist):
        done = sum(1 for i, _ds in hist if isinstance(i, RequestDone) and i.phase == "A.forward_prime")
        world.drain_stuck = done == 52 and not any(
            isinstance(d, CellRecorded) and d.phase == "A.forward_prime" for _i, ds in hist for d in ds)
        return None
    _w, h = run(hook=hook)
    c = cells(h)
    assert c["A.forward_prime"].status == "invalid"
    assert c["A.reverse_replay"].status == "invalid" and "its prime A.forward_prime was not measured" in c["A.reverse_replay"].reason
    assert not [a for a in actions(h) if a.action == "send_request" and a.args["phase"] == "A.reverse_replay"]
    assert decisions(h, VerdictReached)[0].hypothesis == "inconclusive"


def test_an_identity_watch_answer_that_differs_mid_phase_aborts_identity_drift():
    state = {"fired": False}

    def hook(world, hist):
        sent = sum(1 for i, _ds in hist if isinstance(i, RequestDone) and i.phase == "B.forward_prime")
        if sent == 5 and not state["fired"]:
            state["fired"] = True
            ident = {**world.identity(), "tensor_parallel": 1}
            return WatchObserved(at_ns=world.now, source="identity", data={"identity": ident, "polled_at_ns": world.now})
        return None
    _w, h = run(hook=hook)
    ab = decisions(h, AbortDecided)
    assert ab[0].reason == "identity_drift" and "identity watch" in ab[0].detail
    assert cells(h)["B.forward_prime"].identity_held is False


def test_a_cell_records_its_prime_its_incarnation_and_that_its_identity_held():
    _w, h = run()
    c = cells(h)["A.reverse_replay"]
    assert c.prime == "A.forward_prime" and c.identity_held is True
    assert c.incarnation_id == cells(h)["A.forward_prime"].incarnation_id is not None


def test_a_window_moves_only_as_its_transition_table_allows():
    import pytest

    from flare_diag.events.stages import Stage, StageError, advance
    assert advance(Stage.IDLE, Stage.OPENING) is Stage.OPENING
    assert advance(Stage.OPENING, Stage.RESTORE) is Stage.RESTORE  # an abort before the take-down restores too
    for bad in ((Stage.IDLE, Stage.EXPERIMENT), (Stage.IDLE, Stage.RESTORE), (Stage.RESTORE, Stage.EXPERIMENT),
                (Stage.EXPERIMENT, Stage.OPENING), (Stage.CLOSED, Stage.OPENING)):
        with pytest.raises(StageError):
            advance(*bad)
    _w, h = run()
    assert closed(h).outcome == "completed"  # a whole window goes idle -> opening -> experiment -> restore -> closed


@pytest.mark.parametrize("fail", [None, "quiesce", "load"])
def test_the_decider_and_the_logs_fold_name_the_same_stage_after_every_input(fail):
    """One vocabulary (events/stages.py): after each input and its decisions, the stage the policy is
    in is the stage the fold of the log so far shows (a window that completes; one whose quiesce fails,
    before the take-down; one whose candidate load fails, after it)."""
    from flare_diag.events.window_fold import WindowFold
    world = World(plan_builtins())
    if fail is not None:
        world.fail[fail] = "unavailable"
    history = drive(WindowPolicy(), world)
    pol, fold, seq = WindowPolicy(), WindowFold(), 0
    seen = []
    for inp, ds in history:
        pol.receive(inp)
        for ev in (inp, *ds):
            seq += 1
            fold.apply(seq, ev)
        assert fold.stage == pol.state.stage
        seen.append(pol.state.stage.value)
    assert seen[-1] == "closed" and ("experiment" in seen) == (fail != "quiesce")


def test_what_the_procedure_waits_for_and_what_it_asked_are_the_decider_state():
    from flare_diag.policies.state import Act
    from tests.policy_world import opened_input
    pol = WindowPolicy()
    (asked,) = decisions([(None, pol.receive(opened_input(plan_builtins())))], ActionRequested)
    assert pol.state.waits == Act((asked.action_id,)) and pol.state.now_ns == 0
    assert {a: x.request for a, x in pol.state.asked.items()} == {asked.action_id: asked.request}
    assert pol.state.learned.rounds == 0  # the estimate starts once the fixtures are known


def test_what_the_schedule_estimate_learned_from_the_rounds_is_the_decider_state():
    pol = WindowPolicy()
    drive(pol, World(plan_builtins()))
    learned = pol.state.learned
    assert learned.rounds > 0 and pol.est.known is learned
    assert learned.completion and learned.load_s > 0 and learned.sums[0] > 0
