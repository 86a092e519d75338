"""`flare-diag rehearse` and `flare-diag run`: one window in the foreground, shown live, reports written at the end."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TextIO
from pathlib import Path

import msgspec
from rich.console import Console

from flare_diag.daemon.rehearsal import virtualtime
from flare_diag.daemon.rehearsal.harness import default_cache
from flare_diag.daemon.session import Places, WindowSession
from flare_diag.daemon.cli.live import LiveView
from flare_diag.daemon.rehearsal.faults import FaultSchedule
from flare_diag.daemon.rehearsal.rehearse import SIM_TOKEN_BYTES, served_flaresim
from flare_diag.daemon.window.runner import Runner
from flare_diag.daemon.window.setup import InputError, WindowSetup, load_fixtures, new_window_id
from flare_diag.daemon.reports.publish import write_reports
from flare_diag.events.envelope import Envelope
from flare_diag.events.signals import quiet_default_executor
from flare_diag.events.store import EventStore, StoreWriteError
from flare_diag.policies.plan import Plan
from flare_diag.policies.planner import Calibration

class _ProbeLog:
    """The window's log for the forecast's probe requests, opened at the first (a forecast that sends none
    leaves no log behind it); each request is logged before it goes out, and its answer after."""

    def __init__(self, db: Path, durable: bool) -> None:
        self.db, self.durable = db, durable
        self.store: EventStore | None = None

    async def __call__(self, ev) -> None:  # noqa: ANN001 - an event
        if self.store is None:
            self.db.parent.mkdir(parents=True, exist_ok=True)
            self.store = await EventStore.open(self.db, durable=self.durable)
        await self.store.append(ev)

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()
            self.store = None


async def run_window(setup: WindowSetup, out: Path, console: Console,
                     faults: FaultSchedule | None = None, events_out: TextIO | None = None) -> dict:
    """Runs one window in the foreground with its own log in `out`, then writes its reports there.

    `faults` (a rehearsal's): set on the simulated host once the site check and the forecast have passed,
    so that the forecast's probe requests do not count towards a fault's request number."""
    quiet_default_executor()  # the operator's Ctrl-C is the loop's, never a worker's
    session = WindowSession(setup)
    places = Places(recipes=out / "recipes", harness=out / "harness", outputs=[out], harness_cache=default_cache(),
                    plan_dir=Path(setup.plan_path).parent.resolve() if setup.plan_path else None, earlier=setup.earlier)
    probe_log = _ProbeLog(out / "log.db", durable=not setup.rehearsal)
    try:
        sched = await session.prepare(places, probe_log)
    finally:
        await probe_log.close()
    for w in setup.site.warnings:
        console.print(f"[yellow]warning:[/] {setup.site.name}: {w}")
    console.print(f"forecast: {sched.render()[-1]} (pace x{sched.pace:.2f} + {sched.overhead_s:.1f} s a request, {sched.calibration or 'plan rates'})")
    if faults is not None:
        try:
            faults.set_unbound()
        except BaseException:
            await session.close()
            raise
        setup.preconditions = [*setup.preconditions, *faults.scheduled()]
    out.mkdir(parents=True, exist_ok=True)
    # the schedule the window starts from, for the operator; the log keeps what it was computed from
    # (the plan and the calibration in window_opened), so an auditor can recompute it
    (out / "forecast.json").write_bytes(msgspec.json.encode(sched) + b"\n")
    return await _foreground(session, new_window_id(setup.plan), out, console, WindowSession.run, events_out, faults)


async def _foreground(session: WindowSession, window_id: str, out: Path, console: Console,
                      drive: Callable[[WindowSession], Awaitable[str]], events_out: TextIO | None = None,
                      faults: FaultSchedule | None = None) -> dict:
    """One window driven in this process with its log in `out`, shown live (or as JSON lines on
    `events_out`) and interruptible; its reports written there once it closes."""
    db, setup = out / "log.db", session.setup
    try:
        # a rehearsal's host is simulated in this process: no effect of its decisions outlives a crash
        # that could lose the log's last commits, so its commits need not wait for the disk (the log
        # stays consistent, WAL); a window on a real site waits for every one
        store = await EventStore.open(db, durable=not setup.rehearsal)
    except BaseException as exc:
        await session.close()
        if isinstance(exc, Exception) and not isinstance(exc, InputError):
            # a disk that is full, or a folder that takes no writes, before the window opened: nothing changed
            raise InputError(f"{db}: the event log cannot be opened ({str(exc)[:200]}); nothing on the host "
                             f"was changed") from None
        raise
    try:
        runner = await session.open(store, window_id)
    except BaseException:
        await session.close()
        await store.close()
        raise
    view = LiveView(console, window_id, events_out)
    def show(envs: list[Envelope]) -> None:
        for e in envs:
            view.on_event(e.seq, e.event(), e.window_id)
    store.subscribe(show)
    if faults is not None:
        store.subscribe(faults.on_commit)
    try:
        with view, Interrupts(runner, console, out):
            await drive(session)
        if faults is not None:  # whether each fault fired, in the log before the reports are written
            await store.append(faults.accounted(), window_id=window_id)
    except StoreWriteError as exc:  # the host restored from memory; the log's folder took no more writes
        await session.close()
        await store.close()
        return await _published_elsewhere(db, runner, window_id, exc, console, durable=not setup.rehearsal)
    finally:
        await session.close()
        await store.close()
    report = write_reports(db, window_id, out)

    async def append(ev) -> None:
        log = await EventStore.open(db, durable=not setup.rehearsal)
        try:
            await log.append(ev, window_id=window_id)
        finally:
            await log.close()
    if await session.after_publishing(append):  # the check that publishing left the history as it was
        report = write_reports(db, window_id, out)
    return report


async def _published_elsewhere(db: Path, runner: Runner, window_id: str, failure: StoreWriteError, console: Console,
                               durable: bool) -> dict:
    """A window whose log stopped taking writes (disk full, I/O error) closed from memory: its log,
    completed with what memory kept, and its reports go to a fallback folder; as a last resort the
    report of what the log holds is printed as one JSON line. One line says where."""
    from flare_diag.daemon.reports.fallback import complete_elsewhere, report_as_json_line
    done = await complete_elsewhere(db, window_id, runner.unlogged, durable)
    if done is not None:
        report, folder = done
        report["published_in"] = str(folder)
        console.print(f"[red]{db.parent}: the event log stopped taking writes ({_short(failure)}); the window "
                      f"closed from memory; its complete log and reports are in {folder}[/]")
        return report
    line = report_as_json_line(db, window_id)
    console.print(f"[red]{db.parent}: the event log stopped taking writes ({_short(failure)}), and no fallback "
                  f"folder took a copy; the report of what the log holds follows as JSON[/]")
    if line is not None:
        os.write(1, line)
        return msgspec.json.decode(line)
    # the policy's own outcome, which it reached from memory (restore_failed, and exit 3, where it did not verify)
    return {"outcome": runner.outcome or "restore_failed", "restoration": {"verified": None}, "window_id": window_id,
            "integrity": {"chain_ok": False, "audit_ok": False}}


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:199] + "…"


async def resume_window(out: Path, console: Console, events_out: TextIO | None = None) -> dict:
    """Picks up the window a foreground `run` left open in `out` (killed, or its machine lost), as the
    daemon does after a restart: the recorded inputs replayed, then straight to restore."""
    from flare_diag.daemon.window.recovery import setup_for_recovery, unfinished_windows
    quiet_default_executor()
    db = out / "log.db"
    if not db.is_file():
        raise InputError(f"{out}: no log.db; expected the --out folder of a foreground `run`")
    try:
        left = await asyncio.to_thread(unfinished_windows, db)
    except Exception as exc:  # not a log, or a broken one: one line
        raise InputError(f"{db}: cannot read the log ({exc})") from None
    if not left:
        raise InputError(f"{out}: its window is closed; nothing to resume (the report is in report.json)")
    u = left[-1]
    if not u.opened.site_profile:
        raise InputError(f"{out}: a rehearsal's window cannot be resumed: its simulator ended with its process")
    setup, mismatches = await asyncio.to_thread(setup_for_recovery, u.opened)
    console.print(f"resuming window {u.window_id} in its restore path ({len(u.inputs)} recorded inputs)"
                  + "".join(f"\n[yellow]mismatch:[/] {m}" for m in mismatches))
    session = WindowSession.resuming(setup, out / "recipes")
    return await _foreground(session, u.window_id, out, console,
                             lambda s: s.resume(u.events, u.opened_wall_ns, mismatches), events_out)


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP during a foreground window: an `operator` abort, so the window
    restores the incumbent and writes its report before the process exits (a lost ssh session must
    not leave a primary quiesced). A second SIGINT within FORCE_S exits at once, saying what may be
    left as it is."""

    FORCE_S = 5.0

    def __init__(self, runner: Runner, console: Console, out: Path) -> None:
        self.runner, self.console, self.out = runner, console, out
        self.first: float | None = None
        self._aborting: asyncio.Task | None = None  # held: the loop keeps only a weak reference to a task

    def __enter__(self) -> Interrupts:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, self._on, sig)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)

    def _on(self, sig: signal.Signals) -> None:
        now = time.monotonic()
        if sig == signal.SIGINT and self.first is not None and now - self.first < self.FORCE_S:
            self.console.print(f"[red bold]second interrupt: exiting now, without finishing the restore.[/] The primary may "
                               f"still be quiesced with a candidate loaded; the log is {self.out / 'log.db'}. Resume its "
                               f"restore with `flare-diag run --resume {self.out}`, or check the host "
                               f"(`flare-diag site check`) and restore the incumbent by hand.")
            os._exit(130)
        if self.first is None:
            self.first = now
            self.console.print(f"[yellow bold]{sig.name}[/]: aborting the window; restoring the incumbent first "
                               f"(press Ctrl-C again within {self.FORCE_S:g} s to exit at once)")
            # A signal handler runs as a loop callback, outside any task, where anyio cannot name its
            # backend when sniffio is installed (sniffio looks for a current task): the abort would
            # raise there and the window would run on. It is handed to a task of its own.
            self._aborting = asyncio.get_running_loop().create_task(self._abort(sig))

    async def _abort(self, sig: signal.Signals) -> None:
        self.runner.abort(f"{sig.name} to the foreground process")


def rehearse(plan_raw: bytes, plan: Plan, scenario: str, faults: list[dict], out: Path, time_scale: float | None,
             console: Console, calibration: Calibration | None = None, accept_partial: bool = False,
             plan_path: str = "", seed: int = 0, events_out: TextIO | None = None,
             candidate: str = "glm-candidate", fixtures: dict | None = None) -> dict:
    """A whole window against flaresim served in this process: in virtual time (`time_scale` None),
    or live-paced on the wall clock at `time_scale`. `fixtures`: the bodies already loaded, else those
    beside the plan, then the built-in ones."""
    main = rehearse_async(plan_raw, plan, scenario, faults, out, console, time_scale=time_scale,
                          calibration=calibration, accept_partial=accept_partial, plan_path=plan_path, seed=seed,
                          events_out=events_out, candidate=candidate, fixtures=fixtures)
    return virtualtime.run(main) if time_scale is None else asyncio.run(main)


async def rehearse_async(plan_raw: bytes, plan: Plan, scenario: str, faults: list[dict], out: Path, console: Console,
                         time_scale: float | None = None, calibration: Calibration | None = None,
                         accept_partial: bool = False, plan_path: str = "", seed: int = 0,
                         events_out: TextIO | None = None, candidate: str = "glm-candidate",
                         fixtures: dict | None = None) -> dict:
    """`rehearse` on the running loop (a VirtualTimeLoop for virtual time); `candidate`: the simulated
    host's recipe the window loads (a follow-on's baseline or policy build)."""
    import secrets
    virtual = time_scale is None
    if virtual and not virtualtime.is_virtual():
        raise RuntimeError("a virtual-time rehearsal needs a VirtualTimeLoop (daemon.virtualtime.run)")
    token = secrets.token_hex(SIM_TOKEN_BYTES)
    async with served_flaresim(scenario, token, time_scale or 1.0, seed, candidate) as (host, site):
        pace = "virtual time (the simulator's cost model)" if virtual else f"wall clock x{time_scale:g}"
        console.print(f"rehearsal against flaresim ({scenario}, seed {seed}) in this process, {pace}; GPU source: simulator")
        # fixtures beside the plan first (an operator's own bodies), then the built-in ones
        beside = [Path(plan_path).parent.resolve()] if plan_path else []
        setup = WindowSetup(plan_raw, plan, site, fixtures or load_fixtures(plan, beside), time_scale or 1.0, rehearsal=True,
                            calibration=calibration, accept_partial=accept_partial, plan_path=plan_path,
                            clock="virtual" if virtual else "wall", sim_seed=seed, inprocess_sim=True,
                            fixture_dirs=[str(d) for d in beside])
        return await run_window(setup, out, console, FaultSchedule(host, faults) if faults else None, events_out)
