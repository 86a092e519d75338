"""A foreground `rehearse` or `run` interrupted by SIGINT, SIGTERM or SIGHUP restores before it exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.daemontools import Sim
from tests.reviewtools import with_review

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("plan") / "small.toml"
    p.write_text(PLAN.read_text().replace('fixture = "c1-52"', 'fixture = "tok1024"').replace(
        'name = "2026-10-22-cache-diagnosis"', 'name = "interrupts"'))
    return p


def interrupted(args: list[str], sig: signal.Signals) -> tuple[int, str]:
    """Runs the CLI until a phase has started, sends `sig` once, and waits for the exit."""
    p = subprocess.Popen([sys.executable, "-m", "flare_diag.daemon.cli", *with_review(args)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    seen: list[str] = []
    deadline = time.monotonic() + 120
    try:
        for line in p.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if "phase A.forward_prime" in line:
                p.send_signal(sig)
                break
            assert time.monotonic() < deadline, "".join(seen)
        rest, _ = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, "".join(seen) + rest


def _check_restored(out: Path, printed: str, sig: signal.Signals) -> None:
    r = json.loads((out / "report.json").read_text())
    assert r["outcome"] == "aborted" and r["abort"]["reason"] == "operator", printed[-2000:]
    assert sig.name in r["abort"]["detail"]
    assert r["restoration"]["verified"] and r["restoration"]["incumbent_sha256_match"]
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]
    assert "restoring the incumbent first" in printed


# in virtual time the signal is an input at the virtual instant the loop sees it; one case is paced on
# the wall clock (--time-scale), the live demonstration mode
@pytest.mark.parametrize("sig,pace", [(signal.SIGINT, []), (signal.SIGTERM, []), (signal.SIGHUP, ["--time-scale", "20"])])
def test_an_interrupted_rehearsal_restores_writes_its_report_and_exits_1(tmp_path, small_plan, sig, pace):
    out = tmp_path / "out"
    rc, printed = interrupted(["rehearse", "--plan", str(small_plan), "--out", str(out), *pace], sig)
    assert rc == 1, printed[-2000:]
    _check_restored(out, printed, sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_an_interrupted_run_against_a_site_puts_the_incumbent_back_and_readmits_it(tmp_path, small_plan, sig):
    sim = Sim(tmp_path)
    try:
        out = tmp_path / "out"
        rc, printed = interrupted(["run", "--plan", str(small_plan), "--site", str(sim.site), "--out", str(out),
                                   "--time-scale", "20"], sig)
        assert rc == 1, printed[-2000:]
        _check_restored(out, printed, sig)
        assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-incumbent"
    finally:
        sim.stop()


def test_a_killed_foreground_run_is_resumed_into_its_restore(tmp_path, small_plan):
    sim = Sim(tmp_path)
    try:
        out = tmp_path / "out"
        rc, printed = interrupted(["run", "--plan", str(small_plan), "--site", str(sim.site), "--out", str(out),
                                   "--time-scale", "20"], signal.SIGKILL)
        assert rc == -signal.SIGKILL and not (out / "report.json").exists()
        assert sim.get("/manager/v1/state")["loaded"]["recipe"] != "glm-incumbent"  # left taken apart
        p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "run", "--resume", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=180, env={**os.environ, "COLUMNS": "200"})
        assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
        assert "resuming window" in p.stdout
        r = json.loads((out / "report.json").read_text())
        assert r["outcome"] == "aborted" and r["abort"]["reason"] == "daemon_restart"
        assert r["restoration"]["verified"] and r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]
        assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-incumbent"
        again = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "run", "--resume", str(out)], cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 2 and "nothing to resume" in again.stderr
    finally:
        sim.stop()
