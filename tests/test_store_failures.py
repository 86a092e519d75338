"""The store fails loudly and never silently: a raising listener, a checkpoint that cannot be
written, and a commit that fails while a window runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flare_diag.events.schema import LogNote
from flare_diag.daemon.rehearsal import virtualtime
from flare_diag.events.store import EventStore, StoreWriteError
from tests.simtools import served


async def test_a_listener_that_raises_is_dropped_and_the_store_keeps_committing(tmp_path):
    seen: list[int] = []

    def broken(_envs):
        raise RuntimeError("a display bug")

    async with await EventStore.open(tmp_path / "log.db") as store:
        store.subscribe(broken)
        store.subscribe(lambda envs: seen.extend(e.seq for e in envs))
        await store.append(LogNote(text="one"))
        await store.append(LogNote(text="two"))
        assert seen == [1, 2] and store.head[0] == 2


async def test_a_checkpoint_that_cannot_be_written_does_not_stop_commits(tmp_path):
    cp = tmp_path / "cp"
    cp.mkdir()  # a folder where the checkpoint file should be: every write fails
    async with await EventStore.open(tmp_path / "log.db", checkpoint_path=cp / "sub" / "x") as store:
        for i in range(3):
            await store.append(LogNote(text=f"n{i}"))
        assert store.head[0] == 3 and store.checkpoint_error


def _window_with_failing_writes(tmp_path, fail, plan_path) -> tuple[object, str]:
    """Runs a window in virtual time against flaresim in-process whose store's commits fail while
    `fail(n, events)` says so (n: the commit's number, events: its envelopes); returns (the runner's
    outcome or exception, the simulator's loaded recipe)."""
    return virtualtime.run(_failing_window(tmp_path, fail, plan_path))


async def _failing_window(tmp_path, fail, plan_path) -> tuple[object, str]:
    from flare_diag.daemon.window.runner import Runner
    from flare_diag.daemon.hosts.target import Target
    from flare_diag.daemon.window.setup import WindowSetup, load_fixtures
    from flare_diag.policies.plan import decode_plan
    raw = plan_path.read_bytes()
    plan = decode_plan(raw)
    async with served() as (host, site):
        setup = WindowSetup(raw, plan, site, load_fixtures(plan, []), rehearsal=True, accept_partial=True, clock="virtual")
        target = Target(setup.site, setup.fixtures, setup.plan_sha256)
        store = await EventStore.open(tmp_path / "log.db")
        real = store._transaction
        calls = {"n": 0}

        def failing(conn, batch):  # on the database thread, as the commit it stands for
            calls["n"] += 1
            if fail(calls["n"], batch.envelopes()):
                raise OSError(28, "No space left on device")
            real(conn, batch)

        store._transaction = failing
        runner = Runner(store, target, "w-disk")
        try:
            result: object = await runner.run(setup.opened("w-disk"))
        except StoreWriteError as exc:
            result = exc
        await target.close()
        await store.close()
        return result, host.engine.recipe if host.engine else None


def test_a_disk_that_fills_mid_window_sends_it_to_restore_and_the_log_catches_up_when_it_frees(tmp_path, monkeypatch, small_plan):
    from flare_diag.events.reader import LogReader
    from flare_diag.events.verify import verify_log
    outcome, loaded = _window_with_failing_writes(tmp_path, lambda n, _events: 60 <= n < 63, small_plan)
    assert outcome == "aborted" and loaded == "glm-incumbent"
    with LogReader(tmp_path / "log.db") as r:
        assert verify_log(r).ok
        evs = [e.event() for e in r.iter()]
    names = [type(e).__name__ for e in evs]
    assert "LogUnwritable" in names and names[-1] == "WindowClosed"
    ab = next(e for e in evs if type(e).__name__ == "AbortDecided")
    assert ab.reason == "store_failure"
    rest = next(e for e in evs if type(e).__name__ == "RestorationRecorded")
    assert rest.verified
    # nothing lost in between: every request the window decided has its outcome in the log
    asked = {e.action_id for e in evs if type(e).__name__ == "ActionRequested"}
    answered = {e.action_id for e in evs if type(e).__name__ in ("ActionDone", "RequestDone")}
    assert asked == answered


def test_a_disk_that_stays_full_still_gets_the_incumbent_back_and_says_what_the_log_lacks(tmp_path, monkeypatch, small_plan):
    outcome, loaded = _window_with_failing_writes(tmp_path, lambda n, _events: n >= 60, small_plan)
    assert isinstance(outcome, StoreWriteError) and "restored from memory" in str(outcome)
    assert "are not in the log" in str(outcome)
    assert loaded == "glm-incumbent"


def test_a_checkpoint_write_that_raises_mid_window_neither_stops_the_window_nor_its_restore(tmp_path, monkeypatch, small_plan):
    from flare_diag.events.checkpoint import CheckpointSlots
    from flare_diag.events.reader import LogReader
    from flare_diag.events.verify import verify_log
    real = CheckpointSlots.write
    calls = {"n": 0}

    def emfile(*args):
        calls["n"] += 1
        if calls["n"] >= 20:  # from the 20th commit on: the process is out of file descriptors
            raise OSError(24, "Too many open files")
        real(*args)

    monkeypatch.setattr(CheckpointSlots, "write", emfile)
    outcome, loaded = _window_with_failing_writes(tmp_path, lambda n, _events: False, small_plan)
    assert outcome in ("completed", "partial") and loaded == "glm-incumbent" and calls["n"] > 20
    with LogReader(tmp_path / "log.db") as r:
        assert verify_log(r).ok
        assert type(list(r.iter())[-1].event()).__name__ == "WindowClosed"


def test_a_failed_commit_of_the_window_close_itself_is_caught_up_before_the_runner_returns(tmp_path, monkeypatch, small_plan):
    from flare_diag.events.reader import LogReader
    from flare_diag.events.verify import verify_log
    failed = []

    def the_close_once(_n, events):
        if not failed and any(e.type == "window_closed" for e in events):
            failed.append(True)
            return True
        return False
    outcome, loaded = _window_with_failing_writes(tmp_path, the_close_once, small_plan)
    assert failed and outcome in ("completed", "partial") and loaded == "glm-incumbent"
    with LogReader(tmp_path / "log.db") as r:
        assert verify_log(r).ok
        assert type(list(r.iter())[-1].event()).__name__ == "WindowClosed"


async def test_the_daemons_status_says_needs_attention_as_soon_as_the_log_stops_taking_commits(tmp_path, small_plan,
                                                                                               monkeypatch):
    """The service in this process (its store can be made to fail), against flaresim as a process."""
    import anyio

    from flare_diag.daemon.service.logs import configure
    from flare_diag.daemon.window import runner
    # what is asserted is said while the window runs; its closing catch-up need not take its 20 s here
    monkeypatch.setattr(runner, "FINAL_CATCH_UP_S", 2.0)
    svc, sim, start = await _service_with_a_window(tmp_path, small_plan, configure("error"))
    seen: list[dict] = []
    try:
        async with anyio.create_task_group() as tg:
            await _serve_and_start(svc, start, tg)
            with anyio.fail_after(60):
                while not (svc.window and svc.window.progress.phase_requests >= 2):
                    await anyio.sleep(0.05)

            def full(conn, batch):
                raise OSError(28, "No space left on device")

            svc.store._transaction = full  # the disk fills
            with anyio.fail_after(60):  # real seconds; the window restores from memory meanwhile
                while True:
                    st = svc._status()
                    seen.append({**st, "window_still_running": svc.window is not None})
                    if st["state"] == "needs_attention":
                        break
                    await anyio.sleep(0.05)
            svc._stop.set()
    finally:
        sim.stop()
    st = seen[-1]
    assert st["needs_attention"]["window_id"] and "cannot be written" in st["needs_attention"]["needs"]
    assert "events are not in the log yet" in st["needs_attention"]["needs"]
    # said while the window still runs from memory (its runner keeps trying the log for 20 s before it
    # gives up), not only once it has given up
    assert st["window_still_running"] and st["window"]["stage"] in ("opening", "experiment", "restore", "closed")


async def test_a_listener_that_raises_on_every_event_leaves_the_window_to_complete_and_its_report_published(
        tmp_path):
    """The service in this process, with one more store listener that raises on every commit; the
    journal (the service's stdout) names it once, with the window. A whole window, cut to one phase:
    what is tested is the listener, at every commit from the take-down to the readmission."""
    import io
    import json

    import anyio

    from flare_diag.daemon.service.logs import configure

    def a_broken_display(_envs):
        raise RuntimeError("a display bug")

    from tests.daemontools import one_phase_plan
    journal = io.StringIO()
    plan = one_phase_plan(tmp_path / "one-phase.toml", "broken-listener")
    svc, sim, start = await _service_with_a_window(tmp_path, plan, configure("info", journal))
    try:
        async with anyio.create_task_group() as tg:
            await _serve_and_start(svc, start, tg, lambda s: s.store.subscribe(a_broken_display))
            with anyio.fail_after(300):  # real seconds, at the rehearsal's scale
                while "report published" not in journal.getvalue():
                    await anyio.sleep(0.1)
            svc._stop.set()
    finally:
        sim.stop()
        configure("error")
    lines = [json.loads(line[3:]) for line in journal.getvalue().splitlines() if line.startswith("<")]
    named = [ln for ln in lines if "a_broken_display" in ln["event"]]
    window_id = next(ln["window_id"] for ln in lines if ln["event"] == "report published")
    assert len(named) == 1 and window_id in named[0]["event"] and named[0]["level"] == "error"
    reports = list((tmp_path / "state" / "reports").rglob("report.json"))
    report = json.loads(reports[0].read_text())
    assert len(reports) == 1 and report["window_id"] == window_id
    assert report["outcome"] in ("completed", "partial") and report["restoration"]["verified"]

async def _service_with_a_window(tmp_path, small_plan, log):
    """The service in this process (its store and listeners at hand), flaresim as a process, and the
    start of a window of the eight-body plan on it: (the service, the simulator, the start command)."""
    from flare_diag.daemon.service.control import Start
    from flare_diag.daemon.service.notify import Notifier
    from flare_diag.daemon.service.server import Service
    from tests.daemontools import SCALE, Sim
    sim = Sim(tmp_path)
    svc = Service(tmp_path / "state", tmp_path / "run" / "control.sock", log, Notifier(), sites_dir=tmp_path)
    return svc, sim, Start(plan_toml=small_plan.read_text(), site=sim.site.stem, time_scale=SCALE, accept_partial=True)


async def _serve_and_start(svc, start, tg, before_start=None) -> None:
    import anyio

    from tests.reviewtools import review_command
    tg.start_soon(svc.run)
    with anyio.fail_after(30):
        while svc._tg is None or svc._store is None:
            await anyio.sleep(0.05)
    review = review_command(start.plan_toml.encode())  # a production plan's, recorded before its start
    assert b'"ok":true' in (await svc._handle(review, 0, 0)).replace(b" ", b"")
    if before_start is not None:
        before_start(svc)
    reply = await svc._handle(start, 0, 0)
    assert b'"ok":true' in reply.replace(b" ", b""), reply


def _tmpfs(mnt: Path, size: str):
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here (root needed): {p.stderr.strip()}")
    return mnt


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB tmpfs: room for the rehearsal's log as the headroom check counts it (36 MiB)."""
    mnt = _tmpfs(tmp_path / "small", "48m")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill_once_the_log_exists(mnt: Path, stop: threading.Event) -> None:
    """Another writer on the same disk: once the window's log is there, it takes every free byte."""
    wal = mnt / "out" / "log.db-wal"
    # once the window writes (its store opened and its first events committed), not while the store opens
    while not stop.is_set() and not (wal.exists() and wal.stat().st_size > 64 << 10):
        time.sleep(0.005)
    try:
        with open(mnt / "ballast", "wb") as f:
            while not stop.is_set():
                f.write(b"\0" * (1 << 20))
                f.flush()
    except OSError:
        pass  # ENOSPC: the disk is full


def test_a_disk_that_fills_during_a_foreground_window_restores_and_publishes_the_whole_log_elsewhere(tmp_path, small_disk):
    fallback, stop = tmp_path / "fallback", threading.Event()
    filler = threading.Thread(target=_fill_once_the_log_exists, args=(small_disk, stop), daemon=True)
    filler.start()
    try:
        p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "rehearse", "--out", str(small_disk / "out")],
                           capture_output=True, text=True, timeout=600, env={**os.environ, "FLARE_DIAG_FALLBACK_DIR": str(fallback)})
    finally:
        stop.set()
        filler.join(30)
    assert "Traceback" not in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]
    assert p.returncode == 1, (p.stdout + p.stderr)[-3000:]  # aborted, the incumbent restored
    said = [line for line in p.stdout.splitlines() if "stopped taking writes" in line]
    assert len(said) == 1 and str(fallback) in said[0], p.stdout[-2000:]
    (folder,) = [d for d in fallback.iterdir() if d.is_dir()]
    report = json.loads((folder / "report.json").read_text())
    assert report["abort"]["reason"] == "store_failure" and report["restoration"]["verified"], report["abort"]
    assert report["integrity"]["chain_ok"] and report["integrity"]["audit_ok"]
    v = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "log", "verify", str(folder / "log.db")],
                       capture_output=True, text=True, timeout=120)
    assert v.returncode == 0 and v.stdout.startswith("ok:"), v.stdout + v.stderr


def test_a_window_whose_log_would_not_fit_on_its_disk_is_refused_before_anything_starts(tmp_path):
    mnt = _tmpfs(tmp_path / "tiny", "1m")
    try:
        p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "rehearse", "--out", str(mnt / "out")],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 2, (p.stdout + p.stderr)[-2000:]
        assert p.stderr.count("\n") == 1 and "MiB free; this window's log and reports need about" in p.stderr, p.stderr
        assert not (mnt / "out" / "log.db").exists()  # nothing started
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_daemon_whose_state_disk_fills_mid_window_restores_and_publishes_the_whole_log_elsewhere(tmp_path):
    from tests.daemontools import PLAN, QUICK_LOAD_S, SCALE, Daemon, Sim, in_phase
    disk = _tmpfs(tmp_path / "state-disk", "48m")
    fallback, sim = tmp_path / "fallback", Sim(tmp_path, load_s=QUICK_LOAD_S)
    daemon = Daemon(tmp_path, env={"FLARE_DIAG_FALLBACK_DIR": str(fallback)})
    daemon.state = disk / "state"
    try:
        daemon.start()
        p = daemon.cli("start", str(PLAN), "--site", sim.site.stem, "--time-scale", str(SCALE), "--accept-partial")
        assert p.returncode == 0, p.stderr
        daemon.wait_for(in_phase, what="a phase with requests")
        _fill(disk / "ballast")  # another writer takes the rest of the disk while the window runs
        st = daemon.wait_for(lambda s: s["state"] == "needs_attention" and s["window"] is None, timeout=300,
                             what="the window to close from memory")
        assert "complete log and reports are in" in json.dumps(st), st
        assert daemon.proc.poll() is None
    finally:
        daemon.stop()
        sim.stop()
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    (folder,) = [d for d in fallback.iterdir() if d.is_dir()]
    report = json.loads((folder / "report.json").read_text())
    assert report["abort"]["reason"] == "store_failure" and report["restoration"]["verified"], report["abort"]
    assert report["integrity"]["chain_ok"] and report["integrity"]["audit_ok"]
    assert "Traceback" not in daemon.log_path.read_text()


def _fill(path: Path) -> None:
    try:
        with open(path, "wb") as f:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
    except OSError:
        pass  # ENOSPC: the disk is full
