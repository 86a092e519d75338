"""`flare-diagd`: the service. Owns the log, runs one window at a time, serves the control socket.

Lifecycle: open the log; pick up any window a previous run left unfinished (it goes to restore);
listen; tell systemd READY; ping the watchdog from the event loop; on SIGTERM inside a window,
abort it, let it restore, and only then exit.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import sys
from pathlib import Path

import msgspec

from daemon import control
from daemon.control import Abort, BadCommand, Report, Start, Status, Watch
from daemon.logs import configure
from daemon.notify import STATUS_MIN_INTERVAL_S, Notifier
from daemon.publish import FORMATS, build_report, publish_snapshot, render
from daemon.runner import Runner
from daemon.forecast import load_calibration, planned
from daemon.sitecheck import checked_target
from daemon.target import Target
from daemon.windows import InputError, WindowSetup, new_window_id, setup_for_recovery, setup_for_site
from events.envelope import Envelope
from events.progress import WindowProgress
from events.reader import LogReader
from events.schema import ControlCommand, Input, LogNote, WindowOpened
from events.store import EventStore

WATCH_BACKLOG = 10_000  # committed batches a slow watcher may fall behind before it is dropped


class ActiveWindow:
    def __init__(self, window_id: str, setup: WindowSetup, runner: Runner, target: Target) -> None:
        self.window_id = window_id
        self.setup = setup
        self.runner = runner
        self.target = target
        self.progress = WindowProgress(window_id)
        self.task: asyncio.Task[str] | None = None


class Service:
    def __init__(self, state_dir: Path, socket_path: Path, log, notifier: Notifier) -> None:
        self.state_dir = state_dir
        self.socket_path = socket_path
        self.db = state_dir / "log.db"
        self.log = log
        self.notify = notifier
        self.store: EventStore | None = None
        self.window: ActiveWindow | None = None
        self.last: dict | None = None  # progress of the last window that closed
        self.stopping = False
        self._stop = asyncio.Event()

    # --- lifecycle -----------------------------------------------------------------------

    async def run(self) -> int:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = await EventStore.open(self.db)
        self.store.subscribe(self._on_commit)
        await self._recover()
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists() or self.socket_path.is_symlink():
            self.socket_path.unlink()  # a stale socket of a previous run; the log is the state, not the socket
        old = os.umask(0o117)  # the socket is born 0660: no moment when others could connect
        try:
            server = await asyncio.start_unix_server(self._client, path=str(self.socket_path), limit=control.MAX_LINE)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o660)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        watchdog = loop.create_task(self._watchdog()) if self.notify.watchdog_interval_s else None
        refresher = loop.create_task(self._refresh_status()) if self.notify.enabled else None
        self.log.info("ready", socket=str(self.socket_path), log=str(self.db), head_seq=self.store.head[0])
        self.notify.ready(self._status_line())
        try:
            await self._stop.wait()
            if self.window is not None and self.window.task is not None:
                self.log.warning("stopping inside a window: restoring first", window_id=self.window.window_id)
                self.notify.stopping("restoring the incumbent before stopping")
                self.window.runner.abort("flare-diagd is stopping (SIGTERM): restore before exit")
                await asyncio.shield(self.window.task)
            else:
                self.notify.stopping("stopping")
        finally:
            server.close()
            for task in (watchdog, refresher):
                if task is not None:
                    task.cancel()
            try:
                self.socket_path.unlink()
            except FileNotFoundError:
                pass
            await self.store.close()
            self.log.info("stopped")
        return 0

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.stopping:
            self.log.warning("signal ignored: already stopping", signal=sig.name)
            return
        self.stopping = True
        self.log.info("stop requested", signal=sig.name)
        self._stop.set()

    async def _watchdog(self) -> None:
        # Pinged from the loop itself, so a wedged loop stops the pings and systemd restarts us.
        while True:
            self.notify.watchdog()
            await asyncio.sleep(self.notify.watchdog_interval_s or 10)

    async def _refresh_status(self) -> None:
        # systemd's status line follows the window's progress once a second, not once per commit
        # (hundreds a minute): a datagram per commit would fill the notify queue.
        while True:
            await asyncio.sleep(STATUS_MIN_INTERVAL_S)
            self.notify.status(self._status_line())

    def _status_line(self) -> str:
        w = self.window
        if w is None:
            last = self.last or {}
            if last.get("outcome") == "restore_failed":  # the first thing `systemctl status` should say
                failed = ", ".join(last.get("restoration_failed") or []) or "restoration checks"
                return f"idle; NEEDS ATTENTION: window {last.get('window_id')} restore_failed ({failed} failed)"
            return "idle"
        p = w.progress
        where = f"phase {p.phase} ({p.phase_requests} requests)" if p.phase else p.stage
        return f"window {w.window_id}: {where}, minute {p.minute}"

    # --- windows -------------------------------------------------------------------------

    async def _recover(self, retry: bool = True) -> None:
        self.last = await asyncio.to_thread(_last_closed_window, self.db)
        unfinished = await asyncio.to_thread(_unfinished_windows, self.db)
        for window_id, opened_wall_ns, inputs, events in unfinished:
            opened = inputs[0]
            assert isinstance(opened, WindowOpened)
            try:
                setup = setup_for_recovery(opened)
            except Exception as exc:  # the site profile is gone or broken: say so, keep the log as it is
                msg = f"cannot resume window {window_id}: {exc}"
                self.log.error("recovery failed", window_id=window_id, error=str(exc))
                await self.store.append(LogNote(text=msg, source="flare-diagd"), window_id=window_id)
                continue
            self.log.warning("resuming an unfinished window in its restore path", window_id=window_id,
                             inputs=len(inputs))
            w = self._new_window(window_id, setup)
            for seq, ev in events:
                w.progress.apply(seq, ev)
            w.task = asyncio.get_running_loop().create_task(
                self._drive(w, w.runner.resume(inputs, opened_wall_ns), retry=retry))
            return  # one window at a time: a second unfinished one would be a bug of an earlier build

    def _new_window(self, window_id: str, setup: WindowSetup, target: Target | None = None) -> ActiveWindow:
        target = target or Target(setup.site, setup.fixtures, setup.plan_sha256, recipe_dir=self.state_dir / "recipes")
        runner = Runner(self.store, target, window_id, setup.time_scale)
        self.window = ActiveWindow(window_id, setup, runner, target)
        return self.window

    async def _drive(self, w: ActiveWindow, run, retry: bool = True) -> str | None:
        outcome: str | None = None
        try:
            outcome = await run
            if outcome == "restore_failed":
                self.log.error("window closed with its restoration not verified", window_id=w.window_id,
                               outcome=outcome, failed_checks=w.progress.restoration_failed, alarms=w.progress.alarms)
            else:
                self.log.info("window closed", window_id=w.window_id, outcome=outcome)
        except Exception:
            # A bug in the runner or the policy: the window's host may be half taken apart. Pick the
            # window up once more as a restart would (fresh policy, recorded inputs, then restore);
            # a second failure leaves it open in the log, and no new window starts until it is dealt with.
            self.log.exception("window runner failed", window_id=w.window_id, retrying=retry)
        finally:
            await w.target.close()
            await self.store.flush()
            self.last = w.progress.as_dict()
            self.window = None
            self.notify.status(self._status_line(), force=True)
        if w.progress.outcome is not None:
            await self._publish(w.window_id)
        elif outcome is None and retry and not self.stopping:
            await self._recover(retry=False)
        return outcome

    async def _publish(self, window_id: str) -> None:
        """A closed window's report goes to a new dated snapshot under the state folder."""
        try:
            report = await asyncio.to_thread(build_report, self.db, window_id)
            folder = await asyncio.to_thread(publish_snapshot, report, self.state_dir / "reports")
            self.log.info("report published", window_id=window_id, folder=str(folder))
        except Exception as exc:  # the log is the record; a failed publication is reported, not fatal
            self.log.error("report publication failed", window_id=window_id, error=str(exc))

    def _on_commit(self, envs: list[Envelope]) -> None:
        w = self.window
        if w is None:
            return
        for e in envs:
            if e.window_id == w.window_id:
                w.progress.apply(e.seq, e.event())

    # --- the control socket --------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            pid, uid, _gid = control.peer_credentials(sock)
        except OSError:
            pid, uid = -1, -1
        try:
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    return
                except asyncio.LimitOverrunError:
                    self.log.warning("control line too long", uid=uid, pid=pid)
                    writer.write(control.error(f"command line longer than {control.MAX_LINE} bytes"))
                    await writer.drain()
                    return
                try:
                    cmd = control.decode_command(line)
                except BadCommand as exc:
                    self.log.warning("bad control command", uid=uid, pid=pid, error=str(exc))
                    writer.write(control.error(str(exc)))
                    await writer.drain()
                    continue
                name = type(cmd).__struct_config__.tag
                self.log.info("control command", cmd=name, uid=uid, pid=pid)
                if isinstance(cmd, Watch):
                    await self._watch(cmd, writer)
                    return
                writer.write(await self._handle(cmd, uid, pid))
                await writer.drain()
        except (ConnectionError, BrokenPipeError):
            return
        finally:
            writer.close()

    async def _handle(self, cmd, uid: int, pid: int) -> bytes:
        if isinstance(cmd, Status):
            return control.reply(**self._status())
        if isinstance(cmd, Start):
            return await self._start(cmd, uid, pid)
        if isinstance(cmd, Abort):
            w = self.window
            if w is None:
                return control.error("no window is running")
            await self.store.append(ControlCommand(cmd="abort", uid=uid, pid=pid, ok=True, detail=cmd.reason),
                                    window_id=w.window_id)
            w.runner.abort(cmd.reason, uid, pid)
            return control.reply(window_id=w.window_id)
        if isinstance(cmd, Report):
            if cmd.format not in FORMATS:
                return control.error(f"format {cmd.format!r}: expected one of {', '.join(FORMATS)}")
            known = await asyncio.to_thread(_window_ids, self.db)
            if cmd.window_id not in known:
                return control.error(f"window {cmd.window_id!r}: not in this daemon's log")
            report = await asyncio.to_thread(build_report, self.db, cmd.window_id)
            return control.reply(window_id=cmd.window_id, format=cmd.format,
                                 content=render(report, cmd.format).decode())
        return control.error("unknown command")

    def _status(self) -> dict:
        w = self.window
        return {"state": ("stopping" if self.stopping else "running") if w else "idle",
                "window": w.progress.as_dict() if w else None, "last_window": self.last,
                "log": {"path": str(self.db), "head_seq": self.store.head[0]}, "pid": os.getpid()}

    async def _start(self, cmd: Start, uid: int, pid: int) -> bytes:
        if self.stopping:
            return control.error("the daemon is stopping; no window starts")
        if self.window is not None:
            return control.error(f"window {self.window.window_id} is running; one window at a time")
        stuck = await asyncio.to_thread(_open_window_ids, self.db)
        if stuck:
            # opened and never closed, and nothing is running it: its host may still be taken apart
            return control.error(f"window {stuck[0]} is unfinished in the log and not running; restore it "
                                 "(restart flare-diagd to resume it in its restore path) before a new window")
        try:
            setup = await asyncio.to_thread(setup_for_site, Path(cmd.plan), Path(cmd.site), cmd.time_scale)
            if cmd.calibrate:
                setup.calibration = await asyncio.to_thread(load_calibration, Path(cmd.calibrate))
            setup.accept_partial = cmd.accept_partial
            # the same read-only site check as `site check`: a site that lacks what the plan needs is
            # refused before anything on it changes; then the forecast
            target = await checked_target(setup, self.state_dir / "recipes")
            try:
                await planned(setup, target)
            except BaseException:
                await target.close()
                raise
        except InputError as exc:
            await self.store.append(ControlCommand(cmd="start", uid=uid, pid=pid, ok=False, detail=str(exc)))
            return control.error(str(exc))
        if self.window is not None:  # another start won the race while the files were read
            await target.close()
            return control.error(f"window {self.window.window_id} is running; one window at a time")
        window_id = new_window_id(setup.plan)
        w = self._new_window(window_id, setup, target)
        await self.store.append(ControlCommand(cmd="start", uid=uid, pid=pid, ok=True,
                                               detail=f"plan {cmd.plan} site {cmd.site}"), window_id=window_id)
        w.task = asyncio.get_running_loop().create_task(self._drive(w, w.runner.run(setup.opened(window_id))))
        self.log.info("window started", window_id=window_id, plan=setup.plan.name, site=setup.site.name,
                      rehearsal=setup.rehearsal, time_scale=setup.time_scale, uid=uid, pid=pid)
        return control.reply(window_id=window_id, rehearsal=setup.rehearsal)

    async def _watch(self, cmd: Watch, writer: asyncio.StreamWriter) -> None:
        """Streams committed events as JSON lines: the backlog from `from_seq`, then each commit."""
        queue: asyncio.Queue[list[Envelope] | None] = asyncio.Queue()

        def push(envs: list[Envelope]) -> None:
            if queue.qsize() >= WATCH_BACKLOG:
                queue.put_nowait(None)  # fell too far behind: end the stream rather than grow without bound
                unsubscribe()
            else:
                queue.put_nowait(envs)

        unsubscribe = self.store.subscribe(push)
        head = self.store.head[0]
        try:
            start = cmd.from_seq
            if start is None:
                wid = self.window.window_id if self.window else (self.last or {}).get("window_id")
                start = await asyncio.to_thread(_first_seq, self.db, wid) if wid else head + 1
            sent = start - 1
            writer.write(control.reply(watching=True, from_seq=start))
            for env in await asyncio.to_thread(_envelopes_between, self.db, start, head):
                writer.write(_event_line(env))
                sent = env.seq
            await writer.drain()
            while True:
                envs = await queue.get()
                if envs is None:
                    writer.write(control.error("watch fell too far behind; reconnect with from_seq", from_seq=sent + 1))
                    await writer.drain()
                    return
                for env in envs:
                    if env.seq > sent:
                        writer.write(_event_line(env))
                        sent = env.seq
                await writer.drain()
        finally:
            unsubscribe()


def _event_line(env: Envelope) -> bytes:
    return msgspec.json.encode({"seq": env.seq, "wall_ns": env.wall_ns, "type": env.type, "schema_v": env.schema_v,
                                "window_id": env.window_id, "event": msgspec.Raw(env.payload)}) + b"\n"


def _window_ids(db: Path) -> list[str]:
    with LogReader(db) as r:
        return r.window_ids()


def _first_seq(db: Path, window_id: str) -> int:
    with LogReader(db) as r:
        row = r.conn.execute("SELECT MIN(seq) FROM events WHERE window_id = ?", (window_id,)).fetchone()
        return row[0] or 1


def _envelopes_between(db: Path, start: int, end: int) -> list[Envelope]:
    if end < start:
        return []
    with LogReader(db) as r:
        return list(itertools.takewhile(lambda e: e.seq <= end, r.iter(from_seq=start)))


def _open_window_ids(db: Path) -> list[str]:
    """Windows opened in the log and never closed."""
    with LogReader(db) as r:
        opened = [e.window_id for e in r.iter(types=["window_opened"])]
        closed = {e.window_id for e in r.iter(types=["window_closed"])}
    return [w for w in opened if w not in closed]


def _last_closed_window(db: Path) -> dict | None:
    """The progress of the most recent window that closed, for `status` after a restart."""
    with LogReader(db) as r:
        closed = list(r.iter(types=["window_closed"]))
        if not closed:
            return None
        p = WindowProgress(closed[-1].window_id)
        for env in r.iter(window_id=closed[-1].window_id):
            p.apply(env.seq, env.event())
        return p.as_dict()


def _unfinished_windows(db: Path) -> list[tuple[str, int, list[Input], list[tuple[int, object]]]]:
    """Windows opened in the log and never closed: (id, opened wall_ns, their inputs, all their events)."""
    out = []
    open_ids = _open_window_ids(db)
    with LogReader(db) as r:
        for wid in open_ids:
            envs = list(r.iter(window_id=wid))
            opened_wall = next(e.wall_ns for e in envs if e.type == "window_opened")
            events = [(e.seq, e.event()) for e in envs]
            out.append((wid, opened_wall, [ev for _seq, ev in events if isinstance(ev, Input)], events))
    return out


def default_socket() -> Path:
    rt = os.environ.get("RUNTIME_DIRECTORY")
    return Path(rt.split(":")[0]) / "control.sock" if rt else Path("/run/flare-diagd/control.sock")


def default_state_dir() -> Path:
    sd = os.environ.get("STATE_DIRECTORY")
    return Path(sd.split(":")[0]) if sd else Path("/var/lib/flare-diagd")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flare-diagd", description="the flare-diag service")
    ap.add_argument("--socket", type=Path, default=None, help="control socket (default: $RUNTIME_DIRECTORY/control.sock)")
    ap.add_argument("--state-dir", type=Path, default=None, help="log and reports (default: $STATE_DIRECTORY)")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    a = ap.parse_args(argv)
    log = configure(a.log_level)
    svc = Service(a.state_dir or default_state_dir(), a.socket or default_socket(), log, Notifier())
    try:
        return asyncio.run(svc.run())
    except Exception as exc:
        log.exception("flare-diagd failed", error=str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
