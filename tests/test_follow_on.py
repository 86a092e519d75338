"""`plan follow-on`: the second window's plan, only from a window that earns it, and the capture stage
only once cache effects and trace overhead are understood."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flare_diag.daemon.cli.commands import main
from flare_diag.policies.plan import decode_plan
from tests.reviewtools import follow_on_reviewed
from tests.simtools import flare_diag_here


def _follow_on(capsys, source: str, *args: str, reviewed: bool = True) -> tuple[int, str]:
    """`plan follow-on SOURCE ...`, with a recorded review of that follow-on unless `reviewed` is False."""
    change = "nsight" if "nsight" in args else args[args.index("--policy") + 1] if "--policy" in args else ""
    more = follow_on_reviewed(Path(source), change) if reviewed and change else []
    capsys.readouterr()
    rc = main(["plan", "follow-on", source, *args, *more])
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


def test_a_churn_window_with_a_policy_that_reuses_more_gives_an_interleaved_follow_on_plan(default_rehearsal, capsys,
                                                                                          tmp_path):
    out = default_rehearsal[2]
    rc, said = _follow_on(capsys, str(out), "--policy", "marconi", "--out", str(tmp_path / "p.toml"))
    assert rc == 0, said
    plan = decode_plan((tmp_path / "p.toml").read_bytes())
    fo = plan.follow_on
    assert fo.stage == "policy" and fo.policy == "marconi" and fo.baseline_policy == "lru_leaf" and not fo.forced
    assert fo.order == ["baseline", "candidate", "candidate", "baseline", "baseline", "candidate"]
    assert fo.model_reused_tokens["marconi"] > fo.model_reused_tokens["lru_leaf"]
    assert fo.reproducer.startswith("288 of 288") and fo.verdict == "row_checkpoint_churn"
    source = json.loads((out / "report.json").read_text())
    assert fo.source_window == source["window_id"] and fo.source_plan_sha256 == source["plan_sha256"]
    # the source's required and comparable phases, then the output-consistency phase on a fresh incarnation
    assert [p.id for p in plan.phases] == [*source_phases(out), "G.identity", "G.output_consistency"]
    assert (tmp_path / plan.follow_on.consistency_fixture / "manifest.json").is_file()


def source_phases(out: Path) -> list[str]:
    return [p.id for p in decode_plan(
        (Path(__file__).resolve().parent.parent / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml").read_bytes()).phases
        if not (p.optional and not p.comparable)]


def test_a_policy_that_reuses_no_more_than_the_incumbents_is_refused_naming_why(default_rehearsal, capsys, tmp_path):
    rc, said = _follow_on(capsys, str(default_rehearsal[2]), "--policy", "lru_leaf", "--out", str(tmp_path / "p.toml"))
    assert rc == 2 and "no more than the incumbent's lru_leaf" in said and not (tmp_path / "p.toml").exists()


def test_force_writes_the_plan_and_records_the_gate_it_passed_over(default_rehearsal, capsys, tmp_path):
    rc, said = _follow_on(capsys, str(default_rehearsal[2]), "--policy", "lru_leaf", "--force",
                          "--out", str(tmp_path / "p.toml"))
    fo = decode_plan((tmp_path / "p.toml").read_bytes()).follow_on
    assert rc == 0 and "FORCED" in said and fo.forced and "no more than the incumbent's" in fo.override


def _rehearsed_with_trace_bounds(tmp: Path, small_plan: Path, bounds: str) -> Path:
    """A rehearsal of the eight-body plan with these lines added to its [trace] table: its out folder."""
    plan = tmp / "plan.toml"
    plan.write_text(small_plan.read_text().replace("[trace]", "[trace]\n" + bounds, 1))
    out = tmp / "out"
    rc, stdout, stderr = flare_diag_here("rehearse", "--plan", str(plan), "--out", str(out))
    assert (out / "report.json").exists(), stdout[-2000:] + stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def overhead_not_understood(tmp_path_factory, small_plan) -> Path:
    """A rehearsal of the eight-body plan whose bounds are too tight for its trace overhead to be understood."""
    return _rehearsed_with_trace_bounds(tmp_path_factory.mktemp("strict"), small_plan, "overhead_max = 0.0001")


def test_the_capture_stage_is_refused_while_the_trace_overhead_is_not_understood(overhead_not_understood, capsys,
                                                                                    tmp_path):
    rc, said = _follow_on(capsys, str(overhead_not_understood), "--stage", "nsight", "--out", str(tmp_path / "n.toml"))
    assert rc == 2 and "the trace overhead is not understood" in said and "C1" in said


@pytest.fixture(scope="module")
def understood_window(tmp_path_factory, small_plan) -> Path:
    """A rehearsal of the eight-body plan whose own bounds call its trace overhead understood."""
    return _rehearsed_with_trace_bounds(tmp_path_factory.mktemp("understood"), small_plan,
                                        "overhead_max = 0.5\noverhead_interval_max = 1.0")


def test_the_capture_stage_is_admitted_from_a_window_whose_cache_effects_and_overhead_are_understood(
        understood_window, capsys, tmp_path):
    report = json.loads((understood_window / "report.json").read_text())
    assert report["trace"]["overhead_understood"] and report["verdict"]["hypothesis"] != "inconclusive"
    rc, said = _follow_on(capsys, str(understood_window), "--stage", "nsight", "--out", str(tmp_path / "n.toml"))
    plan = decode_plan((tmp_path / "n.toml").read_bytes())
    assert rc == 0, said
    assert plan.follow_on.stage == "nsight" and not plan.follow_on.forced
    nsight = next(c for c in plan.conditional if c.id == "nsight_capture")
    assert nsight.admission.startswith("admitted by follow-on from window " + report["window_id"])


def test_a_follow_on_plan_that_lowers_the_seeds_acceptance_bar_is_refused_naming_it():
    from flare_diag.policies.plan import PlanError, plan_from_builtins
    from tests.policy_world import plan_builtins
    plan = plan_builtins()
    plan["follow_on"] = {"stage": "policy", "source_window": "w0", "source_plan_sha256": "x",
                         "verdict": "row_checkpoint_churn", "min_benefit": 0.01}
    with pytest.raises(PlanError, match=r"follow_on.min_benefit = 0.01, max_regression = 0.03: expected at least 5% "
                                        r"benefit and at most 3% regression \(the seed's acceptance rule"):
        plan_from_builtins(plan)


def test_a_follow_on_without_its_recorded_review_is_refused_and_force_does_not_skip_it(default_rehearsal, capsys, tmp_path):
    for force in ([], ["--force"]):
        rc, said = _follow_on(capsys, str(default_rehearsal[2]), "--policy", "marconi", *force,
                              "--out", str(tmp_path / "p.toml"), reviewed=False)
        assert rc == 2 and "no review of a follow-on of window" in said and "--force does not skip" in said, said
        assert not (tmp_path / "p.toml").exists()


def test_a_follow_on_reviewed_only_by_the_source_plans_author_is_refused(default_rehearsal, capsys, tmp_path):
    more = follow_on_reviewed(default_rehearsal[2], "marconi", by="lead-research")
    capsys.readouterr()
    rc = main(["plan", "follow-on", str(default_rehearsal[2]), "--policy", "marconi", "--out", str(tmp_path / "p.toml"),
               *more])
    assert rc == 2 and "by the source plan's author" in capsys.readouterr().err


def test_the_written_follow_on_names_its_review(default_rehearsal, capsys, tmp_path):
    rc, said = _follow_on(capsys, str(default_rehearsal[2]), "--policy", "marconi", "--out", str(tmp_path / "p.toml"))
    assert rc == 0, said
    assert decode_plan((tmp_path / "p.toml").read_bytes()).follow_on.review.startswith("test-reviewer (seq 1 of ")


def test_no_follow_on_comes_from_a_window_whose_restoration_did_not_verify_not_even_forced(capsys, tmp_path):
    import gzip
    import shutil
    db = tmp_path / "restore-failed.db"
    with gzip.open(Path(__file__).parent / "data" / "replay" / "restore-failed-gate.db.gz", "rb") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    capsys.readouterr()
    rc = main(["plan", "follow-on", str(db), "--policy", "marconi", "--force", "--out", str(tmp_path / "p.toml")])
    err = capsys.readouterr().err
    assert rc == 2 and "without a verified restoration" in err and not (tmp_path / "p.toml").exists(), err
