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


def _silent_site(tmp_path: Path) -> tuple[Path, object]:
    """A site whose serving URL accepts connections and never answers: `run` waits in its site check."""
    import socket
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(60)  # a command that exits without asking fails the test, never hangs it
    port = listener.getsockname()[1]
    site = tmp_path / "site"
    site.mkdir()
    (site / "serving.token").write_text("t")
    (site / "site.toml").write_text(f'[serving]\nurl = "http://127.0.0.1:{port}"\ntoken_file = "serving.token"\n'
                                    f'[manager]\nurl = "http://127.0.0.1:{port}"\ntoken_file = "serving.token"\n'
                                    'candidate_recipe = "glm-candidate"\n[gpu]\nsource = "none"\n')
    return site / "site.toml", listener


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_before_the_window_opens_is_one_line_and_128_plus_its_number(tmp_path, sig):
    site, listener = _silent_site(tmp_path)
    plan = ROOT / "fixtures" / "plans" / "peer-llamacpp.toml"  # not a production plan: no GPU watch needed
    try:
        out = tmp_path / "out"
        p = subprocess.Popen([sys.executable, "-m", "flare_diag.daemon.cli", "run", "--plan", str(plan), "--site", str(site),
                              "--out", str(out)], cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        conn, _ = listener.accept()  # the site check's first request: the command is past its start-up
        p.send_signal(sig)
        _stdout, err = p.communicate(timeout=60)
        conn.close()
    finally:
        listener.close()
    assert p.returncode == 128 + sig, err
    assert err == f"flare-diag: interrupted by {sig.name} before the window opened: nothing on the host was changed\n"
    assert not (out / "log.db").exists()


def test_a_second_ctrl_c_within_five_seconds_exits_130_at_once_naming_the_log(tmp_path, small_plan):
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "flare_diag.daemon.cli", *with_review(
        ["rehearse", "--plan", str(small_plan), "--out", str(out), "--time-scale", "20"])], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"})
    seen: list[str] = []
    try:
        for line in p.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if "phase A.forward_prime" in line:
                p.send_signal(signal.SIGINT)
            if "restoring the incumbent first" in line:  # the first was taken: the second, at once
                p.send_signal(signal.SIGINT)
                break
        rest, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    printed = " ".join(("".join(seen) + rest).split())
    assert p.returncode == 130, printed[-2000:]
    assert "second interrupt: exiting now" in printed and str(out / "log.db") in printed
