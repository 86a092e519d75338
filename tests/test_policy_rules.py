"""Plan checks, pure rules, interpretation and the acceptance rule."""

from __future__ import annotations

import ast
from pathlib import Path

import re

import pytest

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


def test_verdict_follows_the_contract_order():
    m = lambda r: {"status": "measured", "host": {"reused_tokens": r}}  # noqa: E731
    assert verdict({})[0] == "inconclusive"
    assert verdict({"A.reverse_replay": m(0), "B.forward_replay": m(5)})[0] == "not_reproduced"
    assert verdict({"A.reverse_replay": m(5), "B.forward_replay": m(0)})[0] == "row_checkpoint_churn"
    assert verdict({"A.reverse_replay": m(0), "B.forward_replay": m(0), "B.small_control": m(3)})[0] == "row_checkpoint_churn"
    assert verdict({"A.reverse_replay": m(0), "B.forward_replay": m(0)})[0] == "key_or_checkpoint_eligibility"


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
                    assert n in ("events.schema", "events.base"), f"{path.name} imports {n}: only the events schema is allowed"


def test_cli_plan_check_passes_the_shipped_plan(capsys):
    from flare_diag.daemon.cli import main
    assert main(["plan", "check", str(PLAN_PATH)]) == 0
    assert "20 phases" in capsys.readouterr().out


def test_cli_plan_check_names_the_first_bad_field_and_exits_2(tmp_path, capsys):
    from flare_diag.daemon.cli import main
    bad = tmp_path / "bad.toml"
    bad.write_bytes(_plan_text(**{"max_tokens = 2048": "max_tokens = -1"}))
    assert main(["plan", "check", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sampling.max_tokens" in err[0]


def test_cli_plan_check_of_a_missing_file_exits_2(tmp_path, capsys):
    from flare_diag.daemon.cli import main
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
