"""Plan checks, pure rules, interpretation and the acceptance rule."""

from __future__ import annotations

import ast
from pathlib import Path

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flare_diag.policies import rules
from flare_diag.policies.acceptance import Run, accept
from flare_diag.policies.interpret import findings, verdict
from flare_diag.policies.plan import PlanError, decode_plan, trace_arm_order
from tests.policy_world import PLAN_PATH

ROOT = Path(__file__).resolve().parent.parent


def _plan_text(**replace) -> bytes:
    text = PLAN_PATH.read_text()
    for a, b in replace.items():
        text = text.replace(a, b)
    return text.encode()


def test_the_2026_10_22_plan_checks_clean():
    plan = decode_plan(PLAN_PATH.read_bytes())
    assert plan.timing.stop_min == 70 and plan.sampling.max_tokens == 2048 and plan.identity.draft_tokens == 2


def test_plan_with_a_wrongly_typed_field_names_it():
    with pytest.raises(PlanError, match=r"timing.stop_min"):
        decode_plan(_plan_text(**{"stop_min = 70 ": 'stop_min = "seventy" '}))


def test_plan_with_an_unknown_field_is_refused():
    with pytest.raises(PlanError, match="unknown field"):
        decode_plan(_plan_text(**{"[sampling]\n": "[sampling]\ncolour = 1\n"}))


def test_plan_whose_reserve_does_not_fit_is_refused():
    with pytest.raises(PlanError, match="restore_reserve_min"):
        decode_plan(_plan_text(**{"stop_min = 70 ": "stop_min = 80 "}))


def test_plan_whose_restore_budget_overruns_its_reserve_is_refused():
    with pytest.raises(PlanError, match="restore_budget_min = 20 .* does not fit timing.restore_reserve_min = 20"):
        decode_plan(_plan_text(**{"[timing]\n": "[timing]\nrestore_budget_min = 20\n"}))


def test_plan_whose_restore_cannot_load_the_incumbent_within_its_budget_is_refused():
    with pytest.raises(PlanError, match="restore's expected .* does not fit its budget"):
        decode_plan(_plan_text(**{"load_s = 60 ": "load_s = 700 "}))


def test_plan_can_never_schedule_an_isolated_replay_of_cooperative_rank_kernels():
    text = PLAN_PATH.read_text() + '\n[[phases]]\nid = "X"\nincarnation = "B"\nkind = "isolated_rank_kernel_replay"\n'
    with pytest.raises(PlanError, match="cooperative rank kernels"):
        decode_plan(text.encode())


def test_trace_arms_alternate_and_cover_three_repetitions_at_c1_and_c4():
    plan = decode_plan(PLAN_PATH.read_bytes())
    order = trace_arm_order(plan.trace)
    assert len(order) == 12
    assert [o[3] for o in order[:6]] == [False, True, True, False, False, True]


def test_drain_requires_every_scheduler_and_transfer_gauge_at_zero():
    z = {g: 0 for g in rules.DRAIN_GAUGES}
    assert rules.drained(z)
    assert not rules.drained({**z, "host_transfers_waiting": 1})


def test_counter_delta_is_none_where_not_observable():
    assert rules.counter_delta({"a": 1, "b": None}, {"a": 4, "b": 2}) == {"a": 3, "b": None}


def test_natural_failures_are_classified():
    assert rules.natural_failure("length", True) == "length_cut"
    assert rules.natural_failure("stop", False) == "empty_visible_output"
    assert rules.natural_failure("stop", True) is None


def test_findings_separate_hits_without_completed_restores():
    cells = {"A.reverse_replay": {"status": "measured", "host": {"lookups": 52, "hits": 10, "fetched_tokens": 0, "reused_tokens": 0}}}
    assert any("without a completed restore" in f for f in findings(cells))


def _m(reused: int, inc: str = "A", hits: int = 0, fetched: int | None = None) -> dict:
    return {"status": "measured", "incarnation_id": inc, "identity_held": True,
            "host": {"lookups": 52, "hits": hits, "fetched_tokens": reused if fetched is None else fetched,
                     "reused_tokens": reused}}


def _primed(**replays: dict) -> dict:
    """Replay cells with their primes measured on the same incarnation."""
    cells = {"A.forward_prime": _m(0, "A"), "B.forward_prime": _m(0, "B")}
    return {**cells, **{k.replace("_", ".", 1): v for k, v in replays.items()}}


def test_verdict_follows_the_contract_order():
    assert verdict({})[0] == "inconclusive"
    assert verdict(_primed(A_reverse_replay=_m(0), B_forward_replay=_m(5, "B")))[0] == "not_reproduced"
    assert verdict(_primed(A_reverse_replay=_m(5), B_forward_replay=_m(0, "B")))[0] == "row_checkpoint_churn"
    assert verdict(_primed(A_reverse_replay=_m(0), B_forward_replay=_m(0, "B"),
                           B_small_control=_m(3, "B")))[0] == "row_checkpoint_churn"
    assert verdict(_primed(A_reverse_replay=_m(0), B_forward_replay=_m(0, "B")))[0] == "key_or_checkpoint_eligibility"


def _gpu(reused: int | None, inc: str = "A") -> dict:
    """A measured cell of an engine with no host tier: host reuse not observable, GPU prefix reuse `reused`."""
    return {"status": "measured", "incarnation_id": inc, "identity_held": True,
            "host": {"lookups": None, "hits": None, "fetched_tokens": None, "reused_tokens": None},
            "gpu": {"hits": None, "reused_tokens": reused}}


def _gpu_primed(rev: int | None, fwd: int | None) -> dict:
    return {"A.forward_prime": _gpu(0), "B.forward_prime": _gpu(0, "B"), "A.reverse_replay": _gpu(rev),
            "B.forward_replay": _gpu(fwd, "B")}


def test_the_gpu_prefix_tier_verdict_is_churn_when_only_the_reverse_replay_reused_blocks():
    hyp, basis, nxt = verdict(_gpu_primed(1280, 0), tier="gpu_prefix")
    assert hyp == "prefix_cache_churn" and "1280 GPU prefix-cache tokens" in basis and "num_gpu_blocks" in nxt


def test_the_gpu_prefix_tier_verdict_is_not_reproduced_when_the_forward_replay_reused_blocks():
    assert verdict(_gpu_primed(1280, 640), tier="gpu_prefix")[0] == "not_reproduced"


def test_the_gpu_prefix_tier_never_names_a_host_cause_without_host_figures():
    for rev, fwd in ((0, 0), (None, None), (0, None)):
        hyp, basis, nxt = verdict(_gpu_primed(rev, fwd), tier="gpu_prefix")
        assert hyp in ("no_prefix_reuse", "inconclusive")
        assert not re.search(r"host[- ](cache|cached|reused|tokens|tier)|checkpoint", basis + nxt), basis + nxt


def test_no_host_reuse_with_host_hits_unobservable_names_neither_the_restore_path_nor_the_keys():
    no_hits = {"status": "measured", "identity_held": True,
               "host": {"lookups": None, "hits": None, "fetched_tokens": None, "reused_tokens": 0}}
    cells = {"A.forward_prime": {**no_hits, "incarnation_id": "A"}, "A.reverse_replay": {**no_hits, "incarnation_id": "A"},
             "B.forward_prime": {**no_hits, "incarnation_id": "B"}, "B.forward_replay": {**no_hits, "incarnation_id": "B"}}
    hyp, basis, _nxt = verdict(cells)
    assert hyp == "inconclusive" and "cannot be told apart" in basis


def test_the_host_tier_on_an_engine_without_one_is_inconclusive():
    assert verdict(_gpu_primed(1280, 0))[0] == "inconclusive"


def test_a_reverse_replay_whose_prime_was_not_measured_nominates_nothing():
    cells = _primed(A_reverse_replay=_m(5), B_forward_replay=_m(0, "B"))
    cells["A.forward_prime"] = {"status": "invalid", "reason": "drain after the phase did not settle within 10 s"}
    hyp, basis, _ = verdict(cells)
    assert hyp == "inconclusive" and "its prime A.forward_prime was not measured" in basis


def test_a_replay_whose_prime_ran_on_another_incarnation_is_not_used():
    cells = _primed(A_reverse_replay=_m(5), B_forward_replay=_m(0, "B"))
    cells["B.forward_replay"]["incarnation_id"] = "B2"
    hyp, basis, _ = verdict(cells)
    assert hyp == "inconclusive" and "another incarnation" in basis


def test_a_cell_whose_closing_identity_differed_is_not_used():
    cells = _primed(A_reverse_replay=_m(5), B_forward_replay=_m(0, "B"))
    cells["A.reverse_replay"]["identity_held"] = False
    assert verdict(cells)[0] == "inconclusive"


def test_hits_that_never_restore_are_the_restore_path():
    cells = _primed(A_reverse_replay=_m(0, hits=11, fetched=0), B_forward_replay=_m(0, "B"))
    cells["A.reverse_replay"]["hit_requests"] = [3, 4, 9]
    hyp, basis, nxt = verdict(cells)
    assert hyp == "restore_path" and "11 host hits" in basis and "3, 4, 9" in basis
    assert "restore/transfer path" in nxt and "not the keys" in nxt


def test_no_hits_at_all_is_key_or_checkpoint_eligibility():
    cells = _primed(A_reverse_replay=_m(0, hits=0, fetched=0), B_forward_replay=_m(0, "B"))
    assert verdict(cells)[0] == "key_or_checkpoint_eligibility"


def test_a_missing_drain_gauge_is_never_read_as_zero():
    z = {g: 0 for g in rules.DRAIN_GAUGES}
    without = {k: v for k, v in z.items() if k != "requests_retiring"}
    assert not rules.drained(without)
    assert rules.drained(without, accept_unobserved=["requests_retiring"])
    assert rules.unseen_drain_gauges(without) == ["requests_retiring"]


def test_identity_changes_name_every_field_gpu_uuids_and_power_limits():
    v = {"tensor_parallel": 2, "incarnation": "i1", "gpus": [{"uuid": "G0", "power_limit_w": 300},
                                                            {"uuid": "G1", "power_limit_w": 300}]}
    assert rules.identity_changes(v, {**v, "trace_enabled": True}) == []
    assert rules.identity_changes(v, {**v, "tensor_parallel": 1}) == ["tensor_parallel: was 2, now 1"]
    lowered = {**v, "gpus": [{"uuid": "G0", "power_limit_w": 300}, {"uuid": "G1", "power_limit_w": 250}]}
    assert rules.identity_changes(v, lowered) == ["GPU G1: power limit was 300 W, now 250 W"]
    moved = {**v, "gpus": [{"uuid": "G0", "power_limit_w": 300}, {"uuid": "G7", "power_limit_w": 300}]}
    assert "GPUs: were" in rules.identity_changes(v, moved)[0]


def _runs(primary, protected=1.0, correct=True, n=3, sha="f"):
    return [Run(fixture_sha256=sha, correct=correct, primary=primary, protected={"p99": protected}) for _ in range(n)]


def test_acceptance_needs_three_matched_repeats():
    assert not accept(_runs(90, n=2), _runs(100)).accepted


def test_acceptance_needs_the_same_fixture_bytes():
    assert "same fixture bytes" in accept(_runs(90, sha="a"), _runs(100, sha="b")).reason


def test_acceptance_needs_independent_correctness():
    assert "correctness" in accept(_runs(90, correct=False), _runs(100)).reason


def test_acceptance_needs_five_percent_primary_benefit():
    assert not accept(_runs(96), _runs(100)).accepted
    assert accept(_runs(95), _runs(100)).accepted


def test_acceptance_refuses_more_than_three_percent_protected_regression():
    res = accept(_runs(90, protected=1.04), _runs(100, protected=1.0))
    assert not res.accepted and "regressed" in res.reason


def test_acceptance_refuses_a_primary_metric_that_was_not_measured():
    res = accept(_runs(float("inf")), _runs(100))
    assert not res.accepted and "not measured" in res.reason


def test_acceptance_refuses_a_protected_metric_missing_from_the_candidate():
    cand = [Run(fixture_sha256="f", correct=True, primary=90) for _ in range(3)]
    res = accept(cand, _runs(100))
    assert not res.accepted and "p99 was not measured" in res.reason


def test_acceptance_holds_a_stricter_bar_when_one_is_set_and_says_which():
    res = accept(_runs(93), _runs(100), min_benefit=0.075)
    assert not res.accepted and res.reason == "not accepted: primary benefit 7.0% is below 7.5%"
    assert accept(_runs(92), _runs(100), min_benefit=0.075).reason.startswith(
        "accepted: primary benefit 8.0% (at least 7.5%)")


IO_MODULES = {"asyncio", "anyio", "httpx", "httpx_sse", "aiosqlite", "sqlite3", "socket", "subprocess", "time",
              "datetime", "os", "pathlib", "io", "threading", "random", "daemon", "fixtures", "uvicorn", "starlette",
              "pynvml", "structlog", "shutil", "signal", "select"}


def test_policies_import_nothing_that_does_io_or_reads_a_clock():
    for path in (ROOT / "policies").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                if n.startswith("flare_diag."):  # the project's own layers, by their folder
                    n = n.removeprefix("flare_diag.")
                top = n.split(".")[0]
                assert top not in IO_MODULES, f"{path.name} imports {n}"
                if top == "events":
                    assert n in ("events.schema", "events.base", "events.actions", "events.answers", "events.stages"), \
                        f"{path.name} imports {n}: only the events schema (its events, actions, answers and stages) is allowed"


def test_cli_plan_check_passes_the_shipped_plan(capsys):
    from flare_diag.daemon.cli.commands import main
    assert main(["plan", "check", str(PLAN_PATH)]) == 0
    assert "20 phases" in capsys.readouterr().out


def test_cli_plan_check_names_the_first_bad_field_and_exits_2(tmp_path, capsys):
    from flare_diag.daemon.cli.commands import main
    bad = tmp_path / "bad.toml"
    bad.write_bytes(_plan_text(**{"max_tokens = 2048": "max_tokens = -1"}))
    assert main(["plan", "check", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sampling.max_tokens" in err[0]


def test_cli_plan_check_of_a_missing_file_exits_2(tmp_path, capsys):
    from flare_diag.daemon.cli.commands import main
    assert main(["plan", "check", str(tmp_path / "none.toml")]) == 2


@pytest.mark.parametrize("swap,field", [
    ({"window_min = 90 ": "window_min = inf "}, "timing.window_min"),
    ({"window_min = 90 ": "window_min = 1e300 "}, "timing.window_min"),
    ({"stop_min = 70 ": "stop_min = nan "}, "timing.stop_min"),
    ({"restore_reserve_min = 20 ": "restore_reserve_min = 0 "}, "timing.restore_reserve_min"),
    ({"restore_reserve_min = 20 ": "restore_reserve_min = -100 "}, "timing.restore_reserve_min"),
    ({"[timing]\n": "[timing]\naction_timeout_s = -5\n"}, "timing.action_timeout_s"),
    ({"[timing]\n": "[timing]\nload_timeout_s = inf\n"}, "timing.load_timeout_s"),
    ({"repetitions = 3": "repetitions = 10000000"}, "trace.repetitions"),
    ({"temperature = ": "temperature = -5 # "}, "sampling.temperature"),
    ({'name = "2026-10-22-cache-diagnosis"': 'name = "../../etc/x"'}, "name"),
])
def test_a_plan_whose_numbers_or_names_a_window_cannot_run_under_is_refused_naming_the_field(swap, field):
    with pytest.raises(PlanError, match=re.escape(field)):
        decode_plan(_plan_text(**swap))


def test_a_plan_nested_thousands_deep_is_refused_in_one_line():
    deep = PLAN_PATH.read_bytes() + b"\nx = " + b"[" * 100_000 + b"]" * 100_000 + b"\n"
    with pytest.raises(PlanError, match="nested too deeply|not valid TOML"):
        decode_plan(deep)


_count = st.one_of(st.none(), st.integers(min_value=0, max_value=10**9))


@given(host=st.fixed_dictionaries({k: _count for k in rules.HOST_KEYS}),
       gpu=st.fixed_dictionaries({"hits": _count, "reused_tokens": _count}))
def test_counters_contradict_exactly_when_a_part_exceeds_its_whole(host, gpu):
    said = rules.counters_contradict(host, gpu)
    tiers = {"host": host, "GPU prefix-cache": gpu}
    over = [(t, p, w) for t, p, w in rules.COUNTER_PARTS
            if tiers[t][p] is not None and tiers[t][w] is not None and tiers[t][p] > tiers[t][w]]
    assert len(said) == len(over)
    for (t, p, w), line in zip(over, said):
        assert line == f"{t} {p} {tiers[t][p]:,} > {w} {tiers[t][w]:,}"


@given(sent=st.integers(min_value=0, max_value=10**6), finished=_count, lookups=_count)
def test_traffic_from_elsewhere_is_named_only_when_the_engine_saw_more_requests_than_the_window_sent(sent, finished, lookups):
    said = rules.traffic_from_elsewhere({"finished": finished, "host_lookups": lookups}, sent)
    more = [v for v in (finished, lookups) if v is not None and v > sent]
    assert (said is None) == (not more)
    if said:
        assert said.endswith(f"requests while the window sent {sent:,}") and all(f"{v:,}" in said for v in more)


def test_fewer_requests_finished_than_answered_is_how_many_finished():
    from flare_diag.policies.rules import finished_short
    assert finished_short({"finished": 5.0}, 8) == 5


@pytest.mark.parametrize("delta", [{"finished": 8.0}, {"finished": 9.0}, {}, {"finished": None}])
def test_as_many_requests_finished_as_answered_or_no_finished_counter_is_no_shortfall(delta):
    from flare_diag.policies.rules import finished_short
    assert finished_short(delta, 8) is None


def test_fewer_tokens_generated_than_the_answers_say_is_the_engines_count():
    from flare_diag.policies.rules import generated_short
    assert generated_short({"generation_tokens": 40.0}, 64) == 40


@pytest.mark.parametrize("delta, generated", [({"generation_tokens": 64.0}, 64), ({"generation_tokens": 70.0}, 64),
                                              ({}, 64), ({"generation_tokens": 10.0}, None)])
def test_as_many_tokens_generated_as_answered_or_a_count_not_known_is_no_shortfall(delta, generated):
    from flare_diag.policies.rules import generated_short
    assert generated_short(delta, generated) is None


# --- an engine's own start-up requests on a fresh incarnation (SGLang's warm-up) ---------------------

WARM_UP = {"finished": 1, "prompt_tokens": 7, "generation_tokens": 8, "engine_queue_s_sum": 0.01,
           "engine_queue_s_count": 1, "host_reused_tokens": 0, "gpu_reused_tokens": 0}


def test_counters_that_show_only_the_engines_warm_up_are_named_as_such():
    assert rules.startup_only(WARM_UP, {}, 16, 8) == "1 start-up request of the engine's own: 7 prompt, 8 generated tokens"


@pytest.mark.parametrize("changed", [
    {"finished": 17, "generation_tokens": 8},       # more requests than the engine sends itself
    {"generation_tokens": 9},                       # more tokens than its warm-up generates
    {"gpu_reused_tokens": 3},                       # a cache counter moved
    {"host_lookups": 1},                            # a counter a warm-up does not move
    {"engine_queue_s_count": 2},                    # two timing samples for one request
    {"finished": 0},                                # tokens with no request finished
])
def test_counters_the_warm_up_does_not_explain_are_not_taken_for_it(changed):
    assert rules.startup_only({**WARM_UP, **changed}, {}, 16, 8) is None


def test_an_engine_that_sends_itself_nothing_has_no_start_up_to_explain_anything():
    assert rules.startup_only(WARM_UP, {}, 0, 0) is None


def test_a_host_cache_in_tokens_may_hold_the_warm_up_but_nothing_more():
    assert rules.startup_only(WARM_UP, {"host_cache_tokens_used": 15}, 16, 8).endswith("15 of them in the host cache")
    assert rules.startup_only(WARM_UP, {"host_cache_tokens_used": 16}, 16, 8) is None
    assert rules.startup_only(WARM_UP, {"rows_used": 1}, 16, 8) is None


@given(st.dictionaries(st.sampled_from(["finished", "prompt_tokens", "generation_tokens", "host_hits", "host_reused_tokens",
                                        "gpu_reused_tokens", "engine_queue_s_count"]), st.integers(0, 50)),
       st.integers(0, 20), st.integers(0, 20))
def test_whatever_the_start_up_explains_moved_no_cache_and_fits_its_bounds(counters, most, each):
    said = rules.startup_only(counters, {}, most, each)
    if said is not None:
        assert not any(counters.get(k) for k in ("host_hits", "host_reused_tokens", "gpu_reused_tokens"))
        assert 0 < counters["finished"] <= most and counters.get("generation_tokens", 0) <= counters["finished"] * each
