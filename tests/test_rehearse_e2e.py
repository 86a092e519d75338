"""End to end: `flare-diag rehearse` starts flaresim as a real process and runs the 2026-10-22 window."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.cli import main
from events.reader import LogReader

ROOT = Path(__file__).resolve().parent.parent
SCALE = "100"  # higher scales turn real HTTP latency into minutes of window time and fail drains


PLAN = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"


@pytest.fixture(scope="module")
def roomy_plan(tmp_path_factory) -> Path:
    """The 2026-10-22 plan with its stop minute at 130 of 150: at a wall-clock time scale the harness's
    own overhead is scaled too (issue 14), so the verdict tests give every arm room to run."""
    p = tmp_path_factory.mktemp("plan") / "roomy.toml"
    p.write_text(PLAN.read_text().replace("window_min = 90 ", "window_min = 150 ").replace("stop_min = 70 ", "stop_min = 130 "))
    return p


def rehearse(tmp_path: Path, *extra: str) -> tuple[int, dict, Path]:
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "daemon.cli", "rehearse", "--out", str(out), "--time-scale", SCALE, *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (out / "report.json").exists(), p.stdout[-2000:] + p.stderr[-2000:]
    return p.returncode, json.loads((out / "report.json").read_text()), out


def _cells(r):
    return {c["phase"]: c for c in r["cells"]}


@pytest.mark.parametrize("scenario,hypothesis", [("flare-47581cca", "row_checkpoint_churn"), ("churn", "row_checkpoint_churn"),
                                                 ("ineligible", "key_or_checkpoint_eligibility")])
def test_rehearsal_gives_the_verdict_the_scenario_implies(tmp_path, roomy_plan, scenario, hypothesis):
    rc, r, out = rehearse(tmp_path, "--scenario", scenario, "--plan", str(roomy_plan))
    assert r["outcome"] == "completed" and rc == 0, (r["abort"], r["restoration"], r["alarms"])
    assert r["verdict"]["hypothesis"] == hypothesis
    assert r["restoration"]["verified"] and r["restoration"]["incumbent_sha256_match"]
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]
    assert {c["status"] for c in r["cells"]} <= {"measured", "failed", "invalid", "deferred"}
    assert _cells(r)["A.forward_prime"]["host"]["reused_tokens"] == 0
    assert main(["log", "verify", str(out / "log.db")]) == 0
    assert main(["log", "audit", str(out / "log.db")]) == 0


@pytest.mark.parametrize("scale", ["100", "200"])
def test_the_shipped_plan_measures_every_required_cell_or_is_refused_before_quiesce_by_the_forecast(tmp_path, scale):
    # At a wall-clock time scale the harness's real latency is multiplied too (issue 14); the
    # rehearsal's probe measures it, and the forecast refuses what would not fit.
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "daemon.cli", "rehearse", "--out", str(out), "--time-scale", scale],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    if p.returncode == 2:
        assert "do not fit before the stop minute 70" in p.stderr and "--accept-partial" in p.stderr
        assert not (out / "log.db").exists()  # refused before the window opened: nothing quiesced
        return
    r = json.loads((out / "report.json").read_text())
    cells = _cells(r)
    required = ("A.identity", "A.forward_prime", "A.reverse_replay", "B.identity", "B.forward_prime", "B.forward_replay")
    assert all(cells[x]["status"] == "measured" for x in required), p.stdout[-2000:]
    assert (p.returncode, r["outcome"]) == (0, "completed")


def test_identity_drift_during_a_trace_arm_aborts_with_identity_drift(tmp_path, roomy_plan):
    # requests 1-232 are the four 52-body phases and the small control, 233-240 the trace warm-up; 245 lands in trace.C1.r1.off
    rc, r, _out = rehearse(tmp_path, "--plan", str(roomy_plan), "--fault", "identity_drift@request=245")
    assert (rc, r["outcome"], r["abort"]["reason"]) == (1, "aborted", "identity_drift")
    cut = [c for c in r["cells"] if c["phase"].startswith("trace.") and c["status"] == "invalid"]
    assert len(cut) == 1 and "identity_drift" in cut[0]["reason"]  # the arm it came in, nothing else
    assert _cells(r)["B.small_control"]["status"] == "measured"
    assert r["restoration"]["verified"]


def test_authentication_fault_during_a_phase_aborts_and_restores(tmp_path):
    rc, r, out = rehearse(tmp_path, "--fault", "auth@request=10", "--accept-partial")
    assert rc == 1 and r["outcome"] == "aborted" and r["abort"]["reason"] == "authentication"
    assert r["restoration"]["verified"]
    with LogReader(out / "log.db") as reader:
        seqs = [(e.seq, e.event()) for e in reader.iter()]
    abort_seq = next(s for s, ev in seqs if type(ev).__name__ == "AbortDecided")
    assert not [ev for s, ev in seqs if s > abort_seq and type(ev).__name__ == "ActionRequested" and ev.experimental]


def test_rehearse_with_an_unknown_scenario_exits_2_and_starts_nothing(tmp_path, capsys):
    assert main(["rehearse", "--scenario", "nope", "--out", str(tmp_path / "o")]) == 2
    assert "no such scenario" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("spec", ["meteor", "xid@request=abc", "xid@request=-1", "slow,factor=0", "drain_stall,duration_s=x"])
def test_rehearse_with_a_bad_fault_spec_exits_2_and_starts_nothing(tmp_path, capsys, spec):
    assert main(["rehearse", "--fault", spec, "--out", str(tmp_path / "o")]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and repr(spec) in err
    assert "flaresim" not in out and not (tmp_path / "o").exists()


def test_rehearse_refuses_an_out_dir_that_already_holds_a_log(tmp_path, capsys):
    (tmp_path / "log.db").write_bytes(b"")
    assert main(["rehearse", "--out", str(tmp_path)]) == 2
