"""The planner: estimates from the work, their revision, the forecast, calibration, and the refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flare_diag.daemon.cli.commands import main
from flare_diag.daemon.hosts.fixture import BUILTIN, load_fixture
from flare_diag.events.schema import ActionDone
from flare_diag.policies.calibration import calibrate
from flare_diag.policies.plan import decode_plan
from flare_diag.policies.planner import BodyWork, Calibration, Estimator, arms, forecast, work_from
from flare_diag.policies.window import WindowPolicy
from tests.policy_world import World, drive, plan_builtins
from tests.reviewtools import with_review

ROOT = Path(__file__).resolve().parent.parent
PLAN_PATH = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"
PLAN = decode_plan(PLAN_PATH.read_bytes())


def work() -> dict:
    return work_from(PLAN, {n: load_fixture(BUILTIN / n).work() for n in ("c1-52", "tok1024")})


def test_a_request_estimate_grows_with_its_prompt_and_its_max_tokens():
    est = Estimator(PLAN, {"f": [BodyWork("a", 100, 1000), BodyWork("b", 100, 9000), BodyWork("c", 2000, 1000)]})
    assert est.request_s("f", 0) < est.request_s("f", 1)
    assert est.request_s("f", 0) < est.request_s("f", 2)


def test_a_body_that_states_no_prompt_tokens_is_estimated_from_its_characters():
    est = Estimator(PLAN, {"f": [BodyWork("a", 100, None, 4000), BodyWork("b", 100, None, 40000)]})
    assert est.request_s("f", 1) - est.request_s("f", 0 ) > 1  # 9,000 more tokens at 6,000 tokens/s


def test_an_observed_round_teaches_the_body_s_tokens():
    est = Estimator(PLAN, work())
    est.observe_round("c1-52", [0], 10.0, {0: 500}, {0: 23000})
    assert est.completion[est.work["c1-52"][0].sha256] == 500 and est.prompt[est.work["c1-52"][0].sha256] == 23000


def test_rounds_twice_as_slow_as_the_model_double_the_pace_and_later_estimates_follow():
    est = Estimator(PLAN, work())
    bodies = est.work["c1-52"]
    for i in range(52):
        x = est.work_s(bodies[i], completion=200 + 30 * i)
        est.observe_round("c1-52", [i], 2 * x, {i: 200 + 30 * i}, {})
    assert abs(est.pace - 2) < 0.1 and est.overhead_s < 0.5
    assert abs(est.request_s("c1-52", 7) - 2 * est.work_s(bodies[7])) < 1.0


def test_a_fixed_cost_per_request_is_learned_as_overhead_not_as_pace():
    est = Estimator(PLAN, work())
    bodies = est.work["c1-52"]
    for i in range(52):
        x = est.work_s(bodies[i], completion=100 + 35 * i)
        est.observe_round("c1-52", [i], x + 5.0, {i: 100 + 35 * i}, {})
    assert abs(est.pace - 1) < 0.1 and abs(est.overhead_s - 5) < 1.0
    cal = est.learned("t")
    assert abs(cal.pace - 1) < 1e-6 and abs(cal.overhead_s - 5) < 1e-6


def test_a_few_rounds_of_one_size_are_learned_as_overhead_at_the_starting_pace():
    est = Estimator(PLAN, work())
    for i in range(3):
        est.observe_round("c1-52", [i], est.work_s(est.work["c1-52"][i], completion=16) + 1.0, {i: 16}, {})
    cal = est.learned("probe")
    assert cal.pace == 1.0 and abs(cal.overhead_s - 1.0) < 1e-3


def test_the_shipped_plan_fits_by_its_own_rates_and_the_schedule_keeps_the_arm_order():
    sched = forecast(PLAN, Estimator(PLAN, work()))
    assert sched.fits and sched.required_end_min < PLAN.timing.stop_min - PLAN.timing.arm_margin_min
    scheduled = [s.phase for s in sched.slots if s.status == "scheduled"]
    assert scheduled[:6] == ["A.identity", "A.forward_prime", "A.reverse_replay", "B.identity", "B.forward_prime",
                             "B.forward_replay"]


def test_a_forecast_at_half_the_decode_rate_does_not_fit_and_names_the_b_arm():
    slow = msgspec.structs.replace(PLAN, rates=msgspec.structs.replace(PLAN.rates, decode_tokens_per_s=55))
    sched = forecast(slow, Estimator(slow, work()))
    assert not sched.fits
    assert "B.forward_replay" in sched.unfit and "A.forward_prime" not in sched.unfit


def test_required_arms_are_planned_before_optional_ones_whatever_the_plan_order():
    raw = msgspec.to_builtins(PLAN)
    raw["phases"] = [{"id": "C.extra", "incarnation": "C", "kind": "replay", "fixture": "c1-52", "optional": True}] + raw["phases"]
    order = [a.id for a in arms(msgspec.convert(raw, type(PLAN)))]
    assert order.index("C") > order.index("B") and order[:2] == ["A", "B"]


def _window_events(**kw):
    hist = drive(WindowPolicy(), World(plan_builtins(), **kw))
    return [e for inp, ds in hist for e in (inp, *ds)]


def test_calibration_from_a_window_learns_each_body_s_tokens_and_the_pace_it_ran_at():
    cal = calibrate(_window_events(request_s=8), "w.db")
    assert cal.rounds > 100 and set(cal.completion_tokens.values()) == {900.0}
    assert cal.load_s is not None and cal.load_s >= 60  # the World takes 60 s to load
    fast = calibrate(_window_events(request_s=4), "w.db")
    est = lambda c: c.pace * 9 + c.overhead_s  # noqa: E731  # a request of 9 s of work by the rate model
    assert est(fast) < est(cal)


def test_a_calibrated_forecast_replaces_the_rate_model_s_guess():
    cal = calibrate(_window_events(request_s=8), "w.db")
    plain = forecast(PLAN, Estimator(PLAN, work()))
    calibrated = forecast(PLAN, Estimator(PLAN, work(), cal))
    assert calibrated.required_end_min != plain.required_end_min and "w.db" in calibrated.calibration


def test_calibration_survives_the_window_opened_event_and_the_policy_starts_from_it():
    cal = Calibration(source="earlier", pace=3.0, overhead_s=0.0)
    pol = WindowPolicy()
    from flare_diag.events.schema import WindowOpened
    pol.receive(WindowOpened(at_ns=0, window_id="w", plan=plan_builtins(), plan_sha256="p", site="s", gpu_source="sim",
                             rehearsal=True, candidate_recipe="c", calibration=msgspec.to_builtins(cal)))
    pol.receive(ActionDone(at_ns=1, action_id=1, ok=True, data={"fixtures": {}}))
    assert pol.est.pace == 3.0 and pol.est.overhead_s == 0.0


def test_plan_forecast_prints_the_schedule_and_exits_0_when_the_required_cells_fit(capsys):
    assert main(["plan", "forecast", str(PLAN_PATH)]) == 0
    out = capsys.readouterr().out
    assert "B.forward_replay" in out and "every required cell fits" in out


def test_plan_forecast_json_names_unfit_cells_and_exits_1(tmp_path, capsys):
    p = tmp_path / "slow.toml"
    p.write_text(PLAN_PATH.read_text().replace("decode_tokens_per_s = 110", "decode_tokens_per_s = 40"))
    assert main(["plan", "forecast", str(p), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert not d["fits"] and "B.forward_replay" in d["unfit"]


def test_the_slowest_first_token_is_the_longest_prompt_at_its_phase_s_concurrency_at_the_estimate_s_pace():
    est = Estimator(PLAN, {"f": [BodyWork("a", 100, 5000), BodyWork("b", 100, 20000)]})
    phases = [msgspec.structs.replace(PLAN.phases[1], fixture="f", concurrency=4)]
    s, whose = est.slowest_first_token(phases)
    assert whose == "f #1 at C4" and s == 4 * est.pace * 20000 / PLAN.rates.prefill_tokens_per_s + est.overhead_s


def _stall_plan(tmp_path, stall_s: float) -> Path:
    p = tmp_path / "stall.toml"
    p.write_text(PLAN_PATH.read_text().replace("[timing]\n", f"[timing]\nstall_s = {stall_s:g}\n", 1))
    return p


def test_plan_forecast_of_a_stall_bound_shorter_than_a_first_token_it_expects_exits_1_naming_the_body(tmp_path, capsys):
    assert main(["plan", "forecast", str(_stall_plan(tmp_path, 1))]) == 1
    out = capsys.readouterr().out
    assert "timing.stall_s = 1 s: expected more than the slowest first token the forecast expects, 4.8 s (c1-52 #35 at C1" in out


def test_rehearse_refuses_a_stall_bound_shorter_than_a_first_token_it_expects_before_anything_starts(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["rehearse", "--plan", str(_stall_plan(tmp_path, 1)), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "timing.stall_s = 1 s" in err and err.rstrip().endswith("raise timing.stall_s; nothing was changed")
    assert not (out / "log.db").exists()


def test_plan_forecast_with_a_log_that_is_not_one_exits_2_naming_it(tmp_path, capsys):
    bad = tmp_path / "nope.db"
    bad.write_text("not a log")
    assert main(["plan", "forecast", str(PLAN_PATH), "--calibrate", str(bad)]) == 2
    assert "nope.db" in capsys.readouterr().err


def test_run_refuses_a_plan_that_does_not_fit_with_exit_2_and_changes_nothing(tmp_path):
    from tests.contract_tools import ContractHost
    p = tmp_path / "slow.toml"
    p.write_text(PLAN_PATH.read_text().replace("decode_tokens_per_s = 110", "decode_tokens_per_s = 40"))
    from tests.contract_tools import host_changes
    # loads of 22 minutes (in a window whose reserve holds a restore's unload and load): the B arm
    # cannot fit whatever pace the probe of this fast host measures
    p.write_text(PLAN_PATH.read_text().replace("load_s = 60 ", "load_s = 1300 ").replace(
        "window_min = 90 ", "window_min = 120 ").replace("restore_reserve_min = 20 ", "restore_reserve_min = 50 "))
    host = ContractHost(tmp_path)
    try:
        out = tmp_path / "out"
        r = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", *with_review(["run", "--plan", str(p), "--site",
                            str(host.site), "--out", str(out)])], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "do not fit" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert not (out / "log.db").exists()
        # nothing is loaded, unloaded, quiesced or traced, and no body is sent (the site does not opt in
        # to pace probing)
        assert not host_changes(host.requests())
    finally:
        host.stop()


def _shipped_plan_progress():
    """The shipped plan opened in a live-view fold, and its fixtures' sizes (not yet given to it)."""
    from flare_diag.daemon.window.setup import read_plan
    from flare_diag.events.progress import WindowProgress
    from flare_diag.events.schema import WindowOpened
    _raw, plan = read_plan(ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml")
    sizes = {f.name: len(load_fixture(BUILTIN / f.name).bodies) for f in plan.fixtures}
    p = WindowProgress("w")
    p.apply(1, WindowOpened(at_ns=0, window_id="w", plan=msgspec.to_builtins(plan), plan_sha256="x", site="s",
                            gpu_source="sim", rehearsal=True, candidate_recipe="c"))
    return plan, sizes, p


def test_the_live_views_phase_totals_are_the_counts_the_planner_sends():
    from flare_diag.policies.planner import all_phases, phase_requests
    plan, sizes, p = _shipped_plan_progress()
    p.fixture_sizes.update(sizes)
    phases = all_phases(plan)
    assert any(ph.id.startswith("trace.") for ph in phases) and any(ph.kind == "identity" for ph in phases)
    for ph in phases:
        p.phase = ph.id
        sent = 0 if ph.kind == "identity" else len(phase_requests(ph, sizes[ph.fixture]))
        assert p.phase_total == sent, ph.id


@pytest.mark.parametrize("field,value", [("pace", 0.0), ("pace", -3.0), ("load_s", -1e9), ("overhead_s", float("nan")),
                                         ("pace", float("inf"))])
def test_a_calibration_outside_physical_bounds_is_refused(field, value):
    from flare_diag.policies.calibration import CalibrationError, check_calibration
    with pytest.raises(CalibrationError, match=f"calibration {field}"):
        check_calibration(Calibration(source="forged", **{field: value}), "forged.db")


def test_the_live_views_window_total_is_every_request_the_planner_would_send():
    from flare_diag.policies.planner import all_phases, phase_requests
    plan, sizes, p = _shipped_plan_progress()
    assert p.requests_planned is None  # not before the fixtures are validated
    p.fixture_sizes.update(sizes)
    planned = sum(0 if ph.kind == "identity" else len(phase_requests(ph, sizes[ph.fixture])) for ph in all_phases(plan))
    assert p.requests_planned == planned and planned > 0


def _phase_s_from_scratch(est: Estimator, ph, skip: int) -> float:
    """phase_s as its definition reads: each round the slowest of its requests, each request the fit
    applied to the body's work as the estimator knows it now."""
    from flare_diag.policies.planner import phase_requests
    reqs = phase_requests(ph, len(est.work[ph.fixture]))[skip:]
    c = max(ph.concurrency, 1)
    rounds = sum(max((est.pace * est.work_s(est.work[ph.fixture][i]) + est.overhead_s for i in reqs[k:k + c]), default=0.0)
                 for k in range(0, len(reqs), c))
    return rounds + (2 * est.drain_s() if skip == 0 else est.drain_s())


_ROUND = st.tuples(st.integers(0, 7), st.floats(0.1, 60), st.one_of(st.none(), st.integers(0, 300)),
                   st.one_of(st.none(), st.integers(0, 5000)))


@settings(max_examples=60, deadline=None)
@given(rounds=st.lists(_ROUND, max_size=30), skips=st.lists(st.integers(0, 20), min_size=1, max_size=3))
def test_phase_estimates_after_any_rounds_are_the_estimates_computed_from_scratch(rounds, skips):
    """The estimator keeps each body's work between rounds: a round that changes a body's tokens, or
    the output share, must be seen by every later estimate, at one request a round and at four."""
    est = Estimator(PLAN, work())
    replay = [p for a in arms(PLAN) for p in a.phases if p.fixture == "tok1024"]
    assert {p.concurrency for p in replay} >= {1, 4}
    for body, took, completion, prompt in rounds:
        for ph in replay:
            for skip in skips:
                assert est.phase_s(ph, skip) == _phase_s_from_scratch(est, ph, skip)
        est.observe_round("tok1024", [body], took, {body: completion}, {body: prompt})


def test_before_any_round_the_estimate_is_exactly_its_starting_pace_and_overhead():
    # values the fit's arithmetic would round to a neighbour (3.8424956329854094): a calibration's figures
    # are the estimate until a round is timed, as every earlier build's log decided with them
    cal = Calibration(pace=3.842495632985409, overhead_s=1.2753451286971085)
    est = Estimator(PLAN, work(), cal)
    assert (est.pace, est.overhead_s) == (3.842495632985409, 1.2753451286971085)
