"""Output consistency: the rule that compares a greedy body's cold answer with its answer given with
reuse, and the plan checks that keep a consistency phase meaningful."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flare_diag.policies.consistency import Answer, finding, judge
from flare_diag.policies.plan import PlanError, plan_from_builtins
from flare_diag.policies.planner import phase_requests
from tests.policy_world import plan_builtins


def _answers(hashes: list[str], cached: int | None = 0, host: int | None = 0) -> list[Answer]:
    return [Answer(i, h, cached, host) for i, h in enumerate(hashes)]


def test_equal_answers_with_reuse_on_the_warm_pass_are_consistent():
    res = judge(_answers(["a", "b"]), _answers(["a", "b"], host=500))
    assert res["consistent"] and res["compared"] == 2 and res["reused_warm"] == 2 and not res["differ"]
    assert finding(res) == ("measured", "consistent: 2 of 2 greedy bodies answered alike cold and with reuse "
                                        "(2 of them with reuse)")


def test_an_answer_that_changes_under_reuse_is_named_with_both_hashes():
    res = judge(_answers(["a", "b"]), _answers(["a", "x"], host=500))
    assert not res["consistent"]
    assert res["differ"] == [{"body_index": 1, "cold_sha256": "b", "warm_sha256": "x", "reused": True}]
    status, why = finding(res)
    assert status == "measured" and why.startswith("INCONSISTENT: 1 of 2 greedy bodies") and "#1" in why


def test_a_warm_pass_that_reused_nothing_did_not_test_consistency():
    status, why = finding(judge(_answers(["a"]), _answers(["a"])))
    assert status == "invalid" and "reused nothing" in why


def test_an_engine_without_host_counters_shows_reuse_by_its_cached_tokens():
    res = judge(_answers(["a"], cached=0, host=None), _answers(["a"], cached=64, host=None))
    assert res["reused_warm"] == 1 and res["consistent"]


def test_answers_whose_text_was_not_read_are_left_out_of_the_comparison():
    res = judge(_answers(["a", ""]), _answers(["a", "b"], host=1))
    assert res["compared"] == 1 and res["unread"] == [1]


@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=20), st.lists(st.sampled_from("abc"), min_size=1, max_size=20))
def test_consistent_exactly_when_every_compared_body_answered_alike(cold, warm):
    n = min(len(cold), len(warm))
    res = judge(_answers(cold[:n]), _answers(warm[:n], host=1))
    assert res["consistent"] == (cold[:n] == warm[:n])
    assert len(res["differ"]) == sum(a != b for a, b in zip(cold[:n], warm[:n]))


def test_the_warm_pass_sends_the_newest_body_first():
    plan = plan_from_builtins(_consistency_plan())
    ph = next(p for p in plan.phases if p.kind == "consistency")
    assert phase_requests(ph, 4) == [0, 1, 2, 3, 3, 2, 1, 0]


def _consistency_plan(temperature: float | None = 0.0, after_replay: bool = False) -> dict:
    plan = plan_builtins()
    fx = plan["fixtures"][0]["name"]
    plan["fixtures"].append({"name": "greedy", **({"temperature": temperature} if temperature is not None else {})})
    phases = [{"id": "G.identity", "incarnation": "G", "kind": "identity", "fresh": True}]
    if after_replay:
        phases.append({"id": "G.replay", "incarnation": "G", "kind": "replay", "fixture": fx})
    phases.append({"id": "G.output_consistency", "incarnation": "G", "kind": "consistency", "fixture": "greedy",
                   "comparable": False})
    plan["phases"] += phases
    return plan


def test_a_consistency_phase_on_a_sampled_fixture_is_refused_naming_the_temperature():
    with pytest.raises(PlanError, match="needs greedy bodies: fixture greedy asks temperature 1, expected 0"):
        plan_from_builtins(_consistency_plan(temperature=None))


def test_a_consistency_phase_after_a_replay_on_its_incarnation_is_refused():
    with pytest.raises(PlanError, match="runs first on a fresh incarnation"):
        plan_from_builtins(_consistency_plan(after_replay=True))


def test_a_warm_pass_whose_reuse_no_figure_shows_is_not_said_to_have_reused_nothing():
    # vLLM without --enable-prompt-tokens-details: the usage has no cached_tokens, and no host counter is mapped
    res = judge(_answers(["a", "b"], cached=None, host=None), _answers(["a", "b"], cached=None, host=None))
    assert res["reused_warm"] == 0 and res["reuse_untold"] == 2
    status, why = finding(res)
    assert status == "invalid" and "reused nothing" not in why
    assert "not observable for 2 of them (their usage carries no cached_tokens and no host counter moved)" in why


def test_an_answer_that_changes_where_reuse_cannot_be_told_is_named_without_a_reuse_claim():
    res = judge(_answers(["a"], cached=None, host=None), _answers(["x"], cached=None, host=None))
    assert res["differ"] == [{"body_index": 0, "cold_sha256": "a", "warm_sha256": "x", "reused": None}]


def test_the_reports_consistency_table_says_reuse_was_not_observable_rather_than_not_exercised():
    from flare_diag.daemon.reports.report_view import consistency_rows
    untold = judge(_answers(["a", "b"], cached=None, host=None), _answers(["a", "x"], cached=None, host=None))
    nothing = judge(_answers(["a"]), _answers(["a"]))
    rows, diffs = consistency_rows({"cells": [{"phase": "A.consistency", "consistency": untold},
                                              {"phase": "B.consistency", "consistency": nothing}]})
    assert [r[-1] for r in rows] == ["INCONSISTENT", "not exercised"]
    assert diffs == [["A.consistency", "#1", "b", "x", "not observable"]]
    rows, _ = consistency_rows({"cells": [{"phase": "A.consistency", "consistency": judge(
        _answers(["a"], cached=None, host=None), _answers(["a"], cached=None, host=None))}]})
    assert rows[0][-1] == "reuse not observable"
