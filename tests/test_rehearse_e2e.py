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
def test_rehearsal_gives_the_verdict_the_scenario_implies(tmp_path, scenario, hypothesis):
    rc, r, out = rehearse(tmp_path, "--scenario", scenario)
    assert r["outcome"] == "completed" and rc == 0
    assert r["verdict"]["hypothesis"] == hypothesis
    assert r["restoration"]["verified"] and r["restoration"]["incumbent_sha256_match"]
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]
    assert {c["status"] for c in r["cells"]} <= {"measured", "failed", "invalid", "deferred"}
    assert _cells(r)["A.forward_prime"]["host"]["reused_tokens"] == 0
    assert main(["log", "verify", str(out / "log.db")]) == 0
    assert main(["log", "audit", str(out / "log.db")]) == 0


def test_authentication_fault_during_a_phase_aborts_and_restores(tmp_path):
    rc, r, out = rehearse(tmp_path, "--fault", "auth@request=10")
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
