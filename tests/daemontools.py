"""Real processes for daemon tests: flaresim on loopback, flare-diagd on a unix socket, the CLI."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"
SCENARIOS = ROOT / "fixtures" / "flaresim" / "scenarios"
SCALE = 100
# window seconds a recipe takes to load on a host in tests about something other than loads (the
# default scenario's 45 s were most of a short window, polled by three watchers every 5 window seconds)
QUICK_LOAD_S = 2.0


def blocked_signals(pid: int, tid: int) -> set[int] | None:
    """The signals thread `tid` of process `pid` blocks, as the kernel has them (None: it has ended)."""
    try:
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    except FileNotFoundError:
        return None
    mask = int(next(ln for ln in status.splitlines() if ln.startswith("SigBlk:")).split()[1], 16)
    return {n + 1 for n in range(64) if mask >> n & 1}


def threads_taking(pid: int, sigs: set[int]) -> list[int]:
    """The threads of process `pid`, other than its main one, that would take one of `sigs`."""
    taking = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        blocked = blocked_signals(pid, int(task.name)) if int(task.name) != pid else None
        if blocked is not None and not sigs <= blocked:
            taking.append(int(task.name))
    return taking


def stop_process(proc: subprocess.Popen) -> None:
    """TERM, then KILL after 5 s; reaped either way."""
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Sim:
    """flaresim as a process with a random token; `site` is a profile pointing every service at it."""

    def __init__(self, tmp: Path, scenario: str = "flare-47581cca", time_scale: float = SCALE,
                 load_s: float | None = None) -> None:
        from flare_diag.daemon.rehearsal.rehearse import start_sim
        if load_s is not None:  # the scenario with recipes that load in `load_s` window seconds
            quick = tmp / "flaresim" / f"{Path(scenario).stem}-load.toml"  # not in a daemon's sites folder
            quick.parent.mkdir(exist_ok=True)
            source = Path(scenario) if scenario.endswith(".toml") else SCENARIOS / f"{scenario}.toml"
            quick.write_text(source.read_text() + f"\nload_s = {load_s}\n")
            scenario = str(quick)
        self.token = secrets.token_hex(16)
        self.proc, self.url = start_sim(scenario, time_scale, self.token)
        (tmp / "sim.token").write_text(self.token)
        svc = lambda extra="": f'url = "{self.url}{extra}"\ntoken_file = "sim.token"\n'  # noqa: E731
        self.site = tmp / "site.toml"
        self.site.write_text(f'[serving]\n{svc()}[manager]\n{svc()}candidate_recipe = "glm-candidate"\n'
                             f'[router]\n{svc("/routed")}backend = "primary"\n[monitoring]\n{svc()}target = "primary"\n'
                             f'[gpu]\nsource = "sim"\n{svc()}')

    def get(self, path: str) -> dict:
        import httpx
        return httpx.get(f"{self.url}{path}", headers={"Authorization": f"Bearer {self.token}"}, timeout=10).json()

    def stop(self) -> None:
        stop_process(self.proc)


class Daemon:
    """flare-diagd as a process; `start()` returns once it logs "ready"."""

    def __init__(self, tmp: Path, env: dict | None = None, sites: Path | None = None, max_files: int | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.args = args  # more flags for flare-diagd
        self.max_files = max_files  # RLIMIT_NOFILE for the daemon, as `prlimit --nofile` would set it
        self.sites = sites or tmp  # the operator's sites directory: a `Sim` writes its site.toml in tmp
        self.socket = tmp / "run" / "control.sock"
        self.state = tmp / "state"
        self.log_path = tmp / "flare-diagd.log"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.reviewed: set[str] = set()  # plan digests reviewed in this daemon's log by the tests' reviewer

    def start(self, timeout: float = 30, wait: bool = True) -> Daemon:
        """Starts the process; with `wait`, returns once it is ready (else call `wait_ready`)."""
        self._out = self.log_path.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "flare_diag.daemon", "--socket", str(self.socket), "--state-dir",
                                      str(self.state), "--sites-dir", str(self.sites), *self.args], cwd=ROOT, stdout=self._out, stderr=subprocess.STDOUT, env=self.env,
                                     preexec_fn=self._limits if self.max_files else None)
        return self.wait_ready(timeout) if wait else self

    def wait_ready(self, timeout: float = 30) -> Daemon:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(r.get("event") == "ready" for r in self.records()[self._seen:]):
                self._seen = len(self.records())
                return self
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            time.sleep(0.05)
        raise AssertionError("flare-diagd did not become ready: " + self.log_path.read_text()[-3000:])

    _seen = 0

    def _limits(self) -> None:
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_files, self.max_files))

    def records(self) -> list[dict]:
        if not self.log_path.exists():
            return []
        out = []
        for line in self.log_path.read_text().splitlines():
            prio = None
            if line[:1] == "<" and line[2:3] == ">" and line[1:2].isdigit():  # journald's priority prefix
                prio, line = int(line[1]), line[3:]
            try:
                out.append({**json.loads(line), "priority": prio})
            except ValueError:
                out.append({"raw": line})
        return out

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """The CLI against this daemon; a `start` of a production plan first records a review of it in the
        daemon's log (`review sign ... --by test-reviewer`), as a production plan needs."""
        if args and args[0] == "start" and len(args) > 1 and Path(args[1]).is_file():
            self.review(Path(args[1]), once=True)
        return subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", *args, "--socket", str(self.socket)], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)

    def review(self, plan: Path, once: bool = False) -> None:
        """A review of `plan`'s bytes by the tests' reviewer, recorded in this daemon's log over its socket
        (`once`: not again for bytes this daemon's reviewer already signed)."""
        import hashlib
        from tests.reviewtools import REVIEWER
        key = hashlib.sha256(plan.read_bytes()).hexdigest()
        if once and key in self.reviewed:
            return
        self.reviewed.add(key)
        # a plan that does not parse is left unreviewed: the start that follows says why it is refused
        subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "review", "sign", str(plan), "--by", REVIEWER,
                        "--socket", str(self.socket)], cwd=ROOT, capture_output=True, text=True, timeout=120)

    def status(self) -> dict:
        """The daemon's status reply, as `status --json` prints it, asked over the control socket from
        this process (a CLI process a poll was 0.18 s of CPU; tests/test_cli.py runs the command itself)."""
        from flare_diag.daemon.cli.client import Connection
        from flare_diag.daemon.service import control
        c = Connection(self.socket)
        try:
            return c.call(control.Status())
        finally:
            c.close()

    def wait_for(self, pred, timeout: float = 60, what: str = "condition") -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if pred(st):
                return st
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}: {st}")

    def kill(self, sig: int = signal.SIGKILL) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        rc = self.proc.wait(120)
        self._out.close()
        return rc

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            self._out.close()


def in_phase(st: dict, min_requests: int = 3) -> bool:
    w = st.get("window") or {}
    return bool(w.get("phase")) and w.get("phase_requests", 0) >= min_requests


class SocketThread:
    """A socket read on a thread of its own until `close()`: `take()` does one read; a read that
    times out just loops, so the thread notices `close()` within the socket's timeout."""

    def __init__(self, sock) -> None:
        import threading
        self.sock = sock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.take()
            except TimeoutError:
                pass

    def take(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def one_phase_plan(path: Path, name: str = "pool-window") -> Path:
    """The shipped plan cut to its first identity phase (its starting observation, which names a cut
    phase, goes too): a whole window in about half a second at x100, for tests about something else. Its
    drains may take 6,000 window seconds (60 real at x100, not the 5 of the floor) and its restore
    reservation is 150 minutes: a machine running a dozen daemons beside another test worker has been
    seen to need more than 5 real seconds for the last gate's two stable scrapes, and these tests are
    about leases and campaigns, not that bound (tests/test_policy_window.py and the fault matrix are)."""
    text = (PLAN.read_text().replace("window_min = 90 ", "window_min = 220")
            .replace("restore_reserve_min = 20 ", "restore_reserve_min = 150")
            .replace("drain_timeout_s = 10 ", "drain_timeout_s = 6000"))
    assert "window_min = 220" in text and "restore_reserve_min = 150" in text and "drain_timeout_s = 6000" in text
    head, _, rest = text.partition("[[phases]]")
    head = head[:head.index("[starting_observation]")] + head[head.index("[[fixtures]]"):]
    path.write_text(head.replace('name = "2026-10-22-cache-diagnosis"', f'name = "{name}"')
                    + "[[phases]]" + rest.split("[[phases]]")[0] + rest[rest.index("[[conditional]]"):])
    return path


def run_acting_at(plan: Path, site: Path, out: Path, line: str, act: Callable[[], Any]) -> tuple[int, dict, Any]:
    """`flare-diag run` of `plan` on `site`, calling `act()` once, as soon as the run prints a line that holds
    `line`: (exit code, report.json, what `act` returned). The report must exist and `act` must have run."""
    p = subprocess.Popen([sys.executable, "-m", "flare_diag.daemon.cli", "run", "--plan", str(plan), "--site", str(site),
                          "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.stdout is not None  # stdout=PIPE
    acted: list[Any] = []
    printed: list[str] = []
    try:
        for text in p.stdout:
            printed.append(text)
            if not acted and line in text:
                acted.append(act())
        rc = p.wait(timeout=900)
    finally:
        p.kill()
    assert acted and (out / "report.json").exists(), "".join(printed)[-3000:]
    return rc, json.loads((out / "report.json").read_text()), acted[0]

