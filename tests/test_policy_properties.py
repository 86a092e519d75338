"""Property tests of the window policy over thousands of random input sequences, and the audit."""

from __future__ import annotations

import random

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flare_diag.events.schema import (
    AbortDecided, ActionDone, ActionRequested, CellRecorded, DaemonRestarted, Decision, OperatorAbort,
    RequestDone, RestorationRecorded, RestoreStarted, Tick, TimeMarked, WatchObserved, WindowClosed, WindowOpened,
)
from flare_diag.policies.audit import audit
from flare_diag.policies.window import WindowPolicy
from tests.policy_world import S, World, drive, plan_builtins

PLAN = plan_builtins()
FAULTS = ["authentication", "malformed_transport", "cuda_error", "out_of_memory", "engine_error", "transport", None]
CHAOS = st.fixed_dictionaries({
    "seed": st.integers(0, 2**32),
    "request_s": st.floats(2, 40),
    "p_fault": st.floats(0, 0.05),
    "p_input": st.floats(0, 0.05),
    "p_natural": st.floats(0, 1),
})


def chaotic_run(params: dict):
    rng = random.Random(params["seed"])
    world = World(PLAN, request_s=params["request_s"], reuse_on=rng.choice([set(), {"A.reverse_replay"}, {"B.forward_replay"}]))
    orig = world.answer

    def answer(d):
        if rng.random() < params["p_fault"]:
            world.fail[d.action] = rng.choice([f for f in FAULTS if f] + ["engine_error"])
        r = orig(d)
        if isinstance(r, RequestDone) and r.outcome == "ok" and rng.random() < params["p_natural"]:
            r = msgspec.structs.replace(r, finish_reason="length", visible_output=False)
        return r

    world.answer = answer

    def hook(w, hist):
        if rng.random() >= params["p_input"]:
            return None
        kind = rng.randrange(6)
        if kind == 0:
            return OperatorAbort(at_ns=w.now, reason="chaos")
        if kind == 1:
            return WatchObserved(at_ns=w.now, source="gpu", data={"xid_events": [{"gpu": "GPU-1", "xid": 48}]})
        if kind == 2:
            return WatchObserved(at_ns=w.now, source="router", data={"config_sha256": "other", "backend": {}})
        if kind == 3:
            w.now += int(rng.uniform(0, 20) * 60 * S)
            return Tick(at_ns=w.now)
        if kind == 4:
            return DaemonRestarted(at_ns=w.now)
        return ActionDone(at_ns=w.now, action_id=rng.randrange(1, 2000), ok=True)

    return drive(WindowPolicy(), world, hook)


def test_two_restarts_during_the_restores_parallel_reads_still_close_the_window():
    # found by the audit property below: the second restart re-asked a re-asked read under the
    # intermediate id, so the restore waited for ever on an answer that had come
    hist = chaotic_run({"seed": 1_542_691_082, "request_s": 2.0, "p_fault": 0.0, "p_input": 0.03125, "p_natural": 0.0})
    assert any(isinstance(d, WindowClosed) for _i, ds in hist for d in ds)


def _t0(hist):
    for inp, ds in hist:
        if any(isinstance(d, TimeMarked) and d.mark == "t0" for d in ds):
            return inp.at_ns
    return None


# each example is a whole window (hundreds of inputs): 120 of them per property keep the suite
# within its time on two cores, and CI's fresh database explores new ones on every run
prop = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@prop
@given(CHAOS)
def test_no_experimental_request_is_decided_at_or_after_the_stop_minute(params):
    hist = chaotic_run(params)
    t0 = _t0(hist)
    for inp, ds in hist:
        if any(isinstance(d, ActionRequested) and d.experimental for d in ds):
            assert t0 is not None and inp.at_ns < t0 + 70 * 60 * S


@prop
@given(CHAOS)
def test_restore_starts_no_later_than_the_stop_minute_or_the_first_abort(params):
    hist = chaotic_run(params)
    t0 = _t0(hist)
    for inp, ds in hist:
        aborted = any(isinstance(d, AbortDecided) for d in ds)
        past_stop = t0 is not None and inp.at_ns >= t0 + 70 * 60 * S
        if aborted or past_stop:
            assert any(isinstance(d, RestoreStarted) for d in ds) or _restore_before(hist, inp)
            break


def _restore_before(hist, inp):
    for i, ds in hist:
        if any(isinstance(d, RestoreStarted) for d in ds):
            return True
        if i is inp:
            return False
    return False


@prop
@given(CHAOS)
def test_every_abort_ends_in_restore_and_a_closed_window(params):
    hist = chaotic_run(params)
    flat = [d for _i, ds in hist for d in ds]
    if any(isinstance(d, AbortDecided) for d in flat):
        assert any(isinstance(d, RestoreStarted) and d.cause == "abort" for d in flat)
        assert flat[-1].outcome in ("aborted", "restore_failed")
    assert isinstance(flat[-1], WindowClosed)
    assert sum(isinstance(d, AbortDecided) for d in flat) <= 1


@prop
@given(CHAOS)
def test_the_primary_is_readmitted_only_after_a_restore_whose_incumbent_and_direct_preflight_passed(params):
    hist = chaotic_run(params)
    flat = [d for _i, ds in hist for d in ds]
    rest = next(d for d in flat if isinstance(d, RestorationRecorded))
    readmits = [d for d in flat if isinstance(d, ActionRequested) and d.action == "readmit"]
    if readmits:
        assert rest.checks["incumbent_sha256_match"] and rest.checks["direct_preflight"]
        assert rest.checks["containment"] is not False
    else:
        assert rest.checks["readmitted"] is not True


@prop
@given(st.integers(0, 2**32), st.floats(2, 30))
def test_natural_output_failures_never_abort(seed, request_s):
    hist = chaotic_run({"seed": seed, "request_s": request_s, "p_fault": 0, "p_input": 0, "p_natural": 0.9})
    flat = [d for _i, ds in hist for d in ds]
    assert not any(isinstance(d, AbortDecided) for d in flat)
    assert sum(c.natural_failures for c in flat if isinstance(c, CellRecorded)) > 0


@prop
@given(CHAOS)
def test_the_same_inputs_always_give_the_same_decisions(params):
    hist = chaotic_run(params)
    pol = WindowPolicy()
    for inp, ds in hist:
        assert pol.receive(inp) == ds


def _records(hist):
    seq, out = 0, []
    for inp, ds in hist:
        for ev in (inp, *ds):
            seq += 1
            out.append((seq, "w-test", ev))
    return out


@prop
@given(CHAOS)
def test_audit_finds_no_divergence_on_a_recorded_window(params):
    res = audit(_records(chaotic_run(params)))
    assert res.ok, res.divergence


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHAOS, st.integers(0, 10**6))
def test_audit_finds_the_first_altered_decision(params, pick):
    recs = _records(chaotic_run(params))
    idx = [i for i, (_s, _w, ev) in enumerate(recs) if isinstance(ev, Decision)]
    i = idx[pick % len(idx)]
    seq, wid, ev = recs[i]
    altered = WindowClosed(outcome="tampered", minute=-1.0) if not isinstance(ev, WindowClosed) else \
        WindowClosed(outcome="tampered", minute=ev.minute)
    recs[i] = (seq, wid, altered)
    res = audit(recs)
    assert not res.ok and res.divergence.seq == seq



def _altered(recs, pick: int, version: str):
    """recs with one decision altered and the window's opening recorded under policy `version`."""
    recs = list(recs)
    idx = [i for i, (_s, _w, ev) in enumerate(recs) if isinstance(ev, Decision)]
    i = idx[pick % len(idx)]
    seq, wid, ev = recs[i]
    recs[i] = (seq, wid, WindowClosed(outcome="tampered", minute=-1.0) if not isinstance(ev, WindowClosed) else
               WindowClosed(outcome="tampered", minute=ev.minute))
    recs = [(s, w, msgspec.structs.replace(e, policy_sha256=version) if isinstance(e, WindowOpened) else e)
            for s, w, e in recs]
    return recs, seq


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHAOS, st.integers(0, 10**6))
def test_audit_names_a_window_decided_by_another_policy_version_not_replayed_rather_than_diverged(params, pick):
    recs, seq = _altered(_records(chaotic_run(params)), pick, "an-older-build")
    res = audit(recs, policy_version="this-build")
    assert not res.ok and res.divergence is None
    assert [(x.window_id, x.policy_sha256, x.at.seq) for x in res.not_replayed] == [("w-test", "an-older-build", seq)]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHAOS, st.integers(0, 10**6))
def test_audit_of_a_decision_altered_under_the_policy_version_that_made_it_is_a_divergence(params, pick):
    recs, seq = _altered(_records(chaotic_run(params)), pick, "this-build")
    res = audit(recs, policy_version="this-build")
    assert not res.ok and res.divergence.seq == seq and not res.not_replayed


def test_audit_goes_on_past_a_window_it_cannot_replay_and_finds_a_divergence_in_the_next():
    params = {"seed": 3, "request_s": 2.0, "p_fault": 0.0, "p_input": 0.0, "p_natural": 0.0}
    old, _ = _altered(_records(chaotic_run(params)), 5, "an-older-build")
    new, seq = _altered(_records(chaotic_run(params)), 7, "this-build")
    offset = old[-1][0]
    recs = [(s, "w-old", e) for s, _w, e in old] + [(s + offset, "w-new", e) for s, _w, e in new]
    res = audit(recs, policy_version="this-build")
    assert [x.window_id for x in res.not_replayed] == ["w-old"]
    assert res.divergence is not None and (res.divergence.window_id, res.divergence.seq) == ("w-new", seq + offset)


def test_a_divergence_is_one_short_line_naming_only_the_fields_that_differ():
    from flare_diag.policies.audit import difference
    from flare_diag.events.schema import VerdictReached
    long = "x" * 300
    want = VerdictReached(hypothesis="row_checkpoint_churn", basis=long + " reused 135,223 host tokens", next_experiment=long)
    found = msgspec.structs.replace(want, basis=long + " reused 135223 host tokens")
    exp, got = difference(want, found)
    assert exp.startswith("verdict_reached basis=") and got.startswith("verdict_reached basis=")
    assert "135,223" in exp and "135223" in got and "next_experiment" not in exp and len(exp) < 120 and len(got) < 120

_status = st.sampled_from(["measured", "failed", "invalid", "deferred", None])
_reuse = st.one_of(st.none(), st.integers(min_value=0, max_value=5))
REQUIRED = ["A.identity", "A.forward_prime", "A.reverse_replay", "B.identity", "B.forward_prime", "B.forward_replay"]


@given(st.dictionaries(st.sampled_from(REQUIRED + ["B.small_control"]), st.tuples(_status, _reuse)))
def test_the_verdict_never_nominates_churn_without_the_measured_control_and_names_every_unmeasured_required_cell(spec):
    from flare_diag.policies.interpret import verdict
    cells = {p: {"status": s, "reason": "r", "host": {"reused_tokens": u}} for p, (s, u) in spec.items() if s}
    hyp, basis, _next = verdict(cells, REQUIRED)
    fwd = cells.get("B.forward_replay")
    if hyp == "row_checkpoint_churn":
        assert fwd and fwd["status"] == "measured" and fwd["host"]["reused_tokens"] == 0
    for p in REQUIRED:
        if (cells.get(p) or {}).get("status") != "measured":
            assert p in basis


# --- the planner inside the window (issue 12) -------------------------------------------------

COSTS = st.fixed_dictionaries({
    "body_s": st.lists(st.floats(0.5, 45), min_size=1, max_size=60),
    "stop_min": st.floats(20, 85),
    "margin": st.floats(0, 5),
    "decode": st.floats(20, 400),
})


def costed_run(params: dict):
    plan = plan_builtins(window_min=110, stop_min=params["stop_min"], restore_reserve_min=20,
                         arm_margin_min=params["margin"])
    plan["rates"]["decode_tokens_per_s"] = params["decode"]
    return drive(WindowPolicy(), World(plan, body_s=params["body_s"]))


costed = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # whole windows


@costed
@given(COSTS)
def test_an_arm_starts_only_when_its_required_phases_fit_by_the_estimate_at_that_moment(params):
    from flare_diag.events.schema import ArmStarted, PhaseStarted
    hist = costed_run(params)
    started: set[str] = set()
    for d in (d for _i, ds in hist for d in ds):
        if isinstance(d, ArmStarted):
            assert d.estimated_end_minute <= d.limit_minute + 1e-3  # minutes are logged to 4 places
            assert d.limit_minute <= params["stop_min"] - params["margin"] + 1e-3
            started.update(d.phases)
        elif isinstance(d, PhaseStarted):
            assert d.phase in started, f"{d.phase} started outside a gated arm"


@costed
@given(COSTS)
def test_no_experimental_request_is_sent_at_or_after_the_stop_minute_whatever_the_costs(params):
    hist = costed_run(params)
    t0 = _t0(hist)
    for inp, ds in hist:
        if any(isinstance(d, ActionRequested) and d.experimental for d in ds):
            assert inp.at_ns < t0 + int(params["stop_min"] * 60 * S)


# --- chained validity and identity held (contract 4, amended 2026-12-01) ---------------------

_CELL = st.fixed_dictionaries({
    "status": st.sampled_from(["measured", "failed", "invalid", "deferred"]),
    "incarnation_id": st.sampled_from(["i1", "i2"]),
    "identity_held": st.sampled_from([True, False, None]),
    "host": st.fixed_dictionaries({"lookups": st.integers(0, 5), "hits": st.integers(0, 5),
                                   "fetched_tokens": st.integers(0, 5), "reused_tokens": st.integers(0, 5)}),
})


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(REQUIRED + ["B.small_control"]), _CELL))
def test_the_verdict_never_reads_a_replay_whose_prime_is_not_measured_nor_a_drifted_cell(cells):
    from flare_diag.policies.interpret import unusable, verdict
    # whatever an unusable cell holds, the verdict is the one it gives with that cell left out
    usable = {p: c for p, c in cells.items() if not unusable(cells, p)}
    masked = {p: (c if p in usable else {"status": "invalid", "reason": "r"}) for p, c in cells.items()}
    scrambled = {p: (c if p in usable else {**c, "host": {"lookups": 9, "hits": 9, "fetched_tokens": 9,
                                                          "reused_tokens": 9}}) for p, c in cells.items()}
    hyp = verdict(cells)[0]
    assert hyp == verdict(masked)[0] == verdict(scrambled)[0]
    if hyp not in ("inconclusive",):
        assert "A.reverse_replay" in usable and "A.forward_prime" in usable
        assert cells["A.reverse_replay"]["identity_held"] is not False
