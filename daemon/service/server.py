"""`flare-diagd`: the service. Owns the log, runs one window at a time, serves the control socket.

Lifecycle: open the log; pick up any window a previous run left unfinished (it goes to restore);
listen; tell systemd READY; ping the watchdog from the event loop; on SIGTERM inside a window,
abort it, let it restore, and only then exit. Everything the service starts (the window, each
control connection, the watchdog) runs in its one anyio task group and ends with it.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import signal
import sys
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import msgspec
from anyio.streams.buffered import BufferedByteReceiveStream

from flare_diag.daemon.service import control
from flare_diag.daemon.service.control import Abort, Archive, BadCommand, Report, Start, Status, Watch
from flare_diag.daemon.service.logs import configure
from flare_diag.daemon.service.paths import default_sites_dir, default_socket, default_state_dir
from flare_diag.daemon.service.notify import STATUS_MIN_INTERVAL_S, Notifier
from flare_diag.daemon.reports.publish import FORMATS, build_report, publish_window, render
from flare_diag.daemon.window.recovery import Unfinished, open_window_ids, setup_for_recovery, unfinished_windows, unrestored_incumbent
from flare_diag.daemon.window.runner import Runner
from flare_diag.daemon.rehearsal.harness import harness_cache
from flare_diag.daemon.session import Places, WindowSession
from flare_diag.daemon.window.reviews import reviews_in
from flare_diag.daemon.window.setup import InputError, WindowSetup, check_review, new_window_id, setup_for_start
from flare_diag.events.base import Event
from flare_diag.events.envelope import Envelope
from flare_diag.events.progress import WindowProgress
from flare_diag.events.reader import LogReader
from flare_diag.events.schema import AbortDecided, CampaignRunStarted, ControlCommand, LeaseGranted, LogNote, ReviewSigned
from flare_diag.events.signals import quiet, quiet_default_executor
from flare_diag.events.store import EventStore, StoreWriteError

if TYPE_CHECKING:
    from flare_diag.daemon.fleet.config import FleetConfig
    from flare_diag.daemon.service.exporter import ServiceMetrics

WATCH_BACKLOG = 10_000  # committed batches a slow watcher may fall behind before it is dropped
MAX_CONNECTIONS = 64    # control connections served at once; more wait in the backlog (or take a priority slot)
ARCHIVE_KEEP_DAYS = 30  # `log archive` through the socket leaves at least this many recent days in the log
# `watch` streams (which read, so they are never idle) may hold only part of the slots, and a uid
# only part of that: a crowd of watchers can never hold every slot `abort` and `status` need
MAX_WATCHERS = 32
MAX_WATCHERS_PER_UID = 8
# beyond MAX_CONNECTIONS, this many more connections are read for one command, answered only if it is
# `status` or `abort`: the on-call engineer's path when every ordinary slot is busy
PRIORITY_SLOTS = 16
PRIORITY_READ_S = 5.0
ACCEPT_BACKOFF_S = (0.05, 2.0)  # after a failed accept (EMFILE, ENFILE, ENOBUFS): first and longest pause
# file descriptors kept for the window itself (its HTTP connections, the log and its WAL, NVML, the
# watchers): control connections get only what the process limit leaves beyond them
FD_RESERVE = 40


def connection_budget() -> tuple[int, int]:
    """(ordinary, priority) control connections this process can hold without starving its window of
    file descriptors: MAX_CONNECTIONS and PRIORITY_SLOTS, or fewer under a low RLIMIT_NOFILE."""
    import resource
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS, PRIORITY_SLOTS
    room = max(4, soft - FD_RESERVE)
    return min(MAX_CONNECTIONS, max(2, room * 3 // 4)), min(PRIORITY_SLOTS, max(2, room // 4))


IDLE_TIMEOUT_S = 60.0   # a connection that sends no complete command for this long is closed
SEND_TIMEOUT_S = 30.0   # a client that does not read its reply (or its watch stream) for this long is dropped


async def _thread(fn, *args):
    return await anyio.to_thread.run_sync(quiet(functools.partial(fn, *args)))


class ActiveWindow:
    """The daemon's one running window: its session (the lifecycle), its progress, and when it is done."""

    def __init__(self, session: WindowSession, runner: Runner) -> None:
        self.window_id = session.window_id
        self.session = session
        self.setup = session.setup
        self.runner = runner
        self.progress = WindowProgress(session.window_id)
        self.done = anyio.Event()


class Service:
    def __init__(self, state_dir: Path, socket_path: Path, log, notifier: Notifier,
                 sites_dir: Path | None = None, trust_log: bool = False, metrics=None,
                 archive_keep_days: int = ARCHIVE_KEEP_DAYS, fleet=None) -> None:
        self.archive_keep_days = archive_keep_days
        self.fleet = fleet  # FleetLink (service/fleetlink.py) when the daemon has fleet settings
        self.metrics = metrics  # daemon.exporter.ServiceMetrics when --metrics-address is given
        self._aborts: dict[str, int] = {}  # windows aborted since the daemon started, by reason
        self.trust_log = trust_log  # the operator vouches for the log as it is (skips the start checks once)
        self.state_dir = state_dir
        self.sites_dir = sites_dir or default_sites_dir()
        self.socket_path = socket_path
        self.db = state_dir / "log.db"
        self.log = log
        self.notify = notifier
        self._store: EventStore | None = None  # opened by start(), before anything else runs
        self.window: ActiveWindow | None = None
        self.last: dict | None = None  # progress of the last window that closed
        self.stopping = False
        self.starting = False  # a start is between its first check and its launch
        # a window opened in the log that nothing runs (it could not be resumed, or its runner failed
        # twice, or its log could not be written): {"window_id", "needs"}; status says NEEDS ATTENTION
        self.stuck: dict | None = None
        self.connections = 0
        self._idle: dict[object, anyio.CancelScope] = {}  # connections waiting for a command, oldest first
        self.watchers: dict[int, int] = {}  # uid -> watch streams open
        self.priority = 0  # priority connections being read
        self._broken: set[str] = set()  # listener parts disabled after an error: "progress", "metrics"
        self.max_connections, self.priority_slots = connection_budget()
        self._stop: anyio.Event | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    # --- lifecycle -----------------------------------------------------------------------

    async def run(self) -> int:
        exit_code = 0
        quiet_default_executor()  # SIGTERM and SIGINT are the loop's (_signals), never a worker thread's
        self._stop = anyio.Event()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        key = checkpoint_key()
        if not self.trust_log:
            problem = await _thread(log_problem_at_start, self.db, key)
            if problem:
                # appending to it would bless it: the next checkpoint would vouch for whatever it holds
                self.log.error("refusing the event log", log=str(self.db), problem=problem,
                               remedy="inspect it with `flare-diag log verify`; start once with --trust-log "
                                      "only if it is known good")
                self.notify.stopping(f"refusing the event log: {problem}")
                return 1
        self._store = await EventStore.open(self.db)
        self.store.checkpoint_key = key
        self.store.subscribe(self._on_commit)
        if self.fleet is not None:
            self.store.subscribe(self.fleet.shipper.committed)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._signals)
                if self.fleet is not None:
                    tg.start_soon(self.fleet.run)
                await self._recover()
                listener = await self._listen()
                tg.start_soon(self._serve, listener)
                if self.notify.watchdog_interval_s:
                    tg.start_soon(self._watchdog)
                if self.notify.enabled:
                    tg.start_soon(self._refresh_status)
                self._publish_metrics()
                self.log.info("ready", socket=str(self.socket_path), log=str(self.db), head_seq=self.store.head[0])
                self.notify.ready(self._status_line())
                await self._stop.wait()
                w = self.window
                if w is not None:
                    self.log.warning("stopping inside a window: restoring first", window_id=w.window_id)
                    self.notify.stopping("restoring the incumbent before stopping")
                    w.runner.abort("flare-diagd is stopping (SIGTERM): restore before exit")
                    await w.done.wait()
                if self.stuck:
                    # nothing here can restore it: say so as loudly as the service can before it exits
                    self.log.error("stopping with a window unfinished: the host may still be taken apart",
                                   window_id=self.stuck["window_id"], needs=self.stuck["needs"])
                    self.notify.stopping(self._status_line())
                    exit_code = 1
                elif w is None:
                    self.notify.stopping("stopping")
                tg.cancel_scope.cancel()
        finally:
            try:
                self.socket_path.unlink()
            except FileNotFoundError:
                pass
            await self.store.close()
            self.log.info("stopped")
        return exit_code

    async def _listen(self) -> anyio.abc.SocketListener:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists() or self.socket_path.is_symlink():
            self.socket_path.unlink()  # a stale socket of a previous run; the log is the state, not the socket
        old = os.umask(0o117)  # the socket is born 0660: no moment when others could connect
        try:
            listener = await anyio.create_unix_listener(self.socket_path)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o660)
        return listener

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for sig in signals:
                self._on_signal(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.stopping:
            self.log.warning("signal ignored: already stopping", signal=sig.name)
            return
        self.stopping = True
        self.log.info("stop requested", signal=sig.name)
        assert self._stop is not None
        self._stop.set()

    async def _watchdog(self) -> None:
        # Pinged from the loop itself, so a wedged loop stops the pings and systemd restarts us.
        while True:
            self.notify.watchdog()
            await anyio.sleep(self.notify.watchdog_interval_s or 10)

    async def _refresh_status(self) -> None:
        # systemd's status line follows the window's progress once a second, not once per commit
        # (hundreds a minute): a datagram per commit would fill the notify queue.
        while True:
            await anyio.sleep(STATUS_MIN_INTERVAL_S)
            self.notify.status(self._status_line())

    def _status_line(self) -> str:
        w = self.window
        if w is None:
            if self.stuck:
                return f"idle; NEEDS ATTENTION: window {self.stuck['window_id']} is unfinished and not running: {self.stuck['needs']}"
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
        self.last = await _thread(_last_closed_window, self.db)
        unfinished: list[Unfinished] = await _thread(unfinished_windows, self.db)
        for u in unfinished:
            try:
                setup, mismatches = await _thread(setup_for_recovery, u.opened)
            except InputError as exc:  # the recorded plan or site profile cannot be used: say so, keep the log
                msg = f"cannot resume window {u.window_id}: {exc}"
                self.log.error("recovery failed", window_id=u.window_id, error=str(exc))
                self.stuck = {"window_id": u.window_id, "needs": f"it cannot be resumed ({exc}); fix that and restart "
                                                                  f"flare-diagd, or restore the incumbent by hand"}
                try:
                    await self.store.append(LogNote(text=msg, source="flare-diagd"), window_id=u.window_id)
                except StoreWriteError:
                    pass  # the journal has it; the log is what cannot be written
                continue
            self.stuck = None
            self.log.warning("resuming an unfinished window in its restore path", window_id=u.window_id,
                             inputs=len(u.inputs), mismatches=mismatches)
            w = await self._new_window(u.window_id, WindowSession.resuming(setup, self.state_dir / "recipes"))
            for seq, ev in u.events:
                w.progress.apply(seq, ev)
            self._launch(w, functools.partial(w.session.resume, u.events, u.opened_wall_ns, mismatches), retry)
            return  # one window at a time: a second unfinished one would be a bug of an earlier build

    async def _new_window(self, window_id: str, session: WindowSession, before: Sequence[Event] = ()) -> ActiveWindow:
        try:
            runner = await session.open(self.store, window_id, before)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await session.close()
            raise
        self.window = ActiveWindow(session, runner)
        return self.window

    def _launch(self, w: ActiveWindow, run, retry: bool = True) -> None:
        assert self._tg is not None
        self._tg.start_soon(self._drive, w, run, retry, name=f"window {w.window_id}")

    async def _drive(self, w: ActiveWindow, run, retry: bool = True) -> str | None:
        try:
            return await self._drive_window(w, run, retry)
        finally:
            w.done.set()  # after the report is published (or the retry ran): a stop waits for all of it

    async def _drive_window(self, w: ActiveWindow, run, retry: bool) -> str | None:
        outcome: str | None = None
        try:
            outcome = await run()
            if outcome == "restore_failed":
                self.log.error("window closed with its restoration not verified", window_id=w.window_id,
                               outcome=outcome, failed_checks=w.progress.restoration_failed, alarms=w.progress.alarms)
            elif outcome == "aborted":
                ab = w.runner.policy.state.abort
                self.log.error("window aborted and restored", window_id=w.window_id, outcome=outcome,
                               reason=ab.reason if ab else None, detail=ab.detail if ab else None)
            else:
                self.log.info("window closed", window_id=w.window_id, outcome=outcome)
        except StoreWriteError as exc:
            if w.runner.outcome is not None:
                # restored from memory, but the log lacks the window's end: a restart (once the disk
                # has room) replays what it holds and restores again; until then, a person should know
                retry = False
            self.log.error("window's event log could not be written", window_id=w.window_id, error=str(exc),
                           restored_from_memory=w.runner.outcome)
            elsewhere = await self._published_elsewhere(w) if w.runner.outcome is not None else None
            self.stuck = {"window_id": w.window_id, "needs": (
                f"its event log cannot be written ({exc}); "
                + (f"the window closed {w.runner.outcome} from memory. " if w.runner.outcome else "")
                + (f"Its complete log and reports are in {elsewhere}. " if elsewhere else "")
                + "Free space on the log's disk, then restart flare-diagd")}
        except Exception:
            # A bug in the runner or the policy: the window's host may be half taken apart. Pick the
            # window up once more as a restart would (fresh policy, recorded inputs, then restore);
            # a second failure leaves it open in the log, and no new window starts until it is dealt with.
            self.log.exception("window runner failed", window_id=w.window_id, retrying=retry)
            self.stuck = {"window_id": w.window_id, "needs": "its runner failed (see the journal); restart flare-diagd "
                                                              "to resume it in its restore path"}
        finally:
            with anyio.CancelScope(shield=True):
                await w.session.close()
                await self.store.flush()
            self.last = w.progress.as_dict()
            self.window = None
            if self.fleet is not None:
                self.fleet.window_closed()
            self.notify.status(self._status_line(), force=True)
            self._publish_metrics()
        if outcome is not None:
            self.stuck = None
        if (w.progress.outcome or outcome) is not None and self.stuck is None:
            await self._publish(w.window_id)
            # the preserved history checked once the report is out, into the log
            await w.session.after_publishing(lambda ev: self.store.append(ev, window_id=w.window_id))
        elif outcome is None and retry and not self.stopping:
            self.store.resume_writes()  # the retry is the recovery path's own attempt to write
            await self._recover(retry=False)
        return outcome

    async def _publish(self, window_id: str) -> None:
        """A closed window's report goes to a new dated snapshot under the state folder."""
        try:
            report, folder = await _thread(publish_window, self.db, window_id, self.state_dir / "reports")
            integ = report["integrity"]
            # the head, outside the database: `flare-diag log verify --anchor SEQ:HASH` checks a log against it
            self.log.info("report published", window_id=window_id, folder=str(folder),
                          anchor=f"{integ['head_seq']}:{integ['head_hash']}", chain_ok=integ["chain_ok"])
        except Exception as exc:  # the log is the record; a failed publication is reported, not fatal
            self.log.error("report publication failed", window_id=window_id, error=str(exc))

    def _on_commit(self, envs: list[Envelope]) -> None:
        """Feeds the window's progress (status, the systemd status line) and the metrics exporter; a
        failure in either is logged once with the window and disables only that part: the store keeps
        this listener, and publication never waits on it."""
        w = self.window
        if w is None:
            return
        if "progress" not in self._broken:
            try:
                for e in envs:
                    if e.window_id == w.window_id:
                        ev = e.event()
                        w.progress.apply(e.seq, ev)
                        if isinstance(ev, AbortDecided):
                            self._aborts[ev.reason] = self._aborts.get(ev.reason, 0) + 1
            except Exception:
                self._broken.add("progress")
                self.log.exception("window progress stopped following the log (status shows the policy's stage "
                                   "from here on)", window_id=w.window_id)
        if "metrics" not in self._broken:
            try:
                self._publish_metrics()
            except Exception:
                self._broken.add("metrics")
                self.log.exception("metrics exporter failed and is disabled", window_id=w.window_id)

    def _publish_metrics(self) -> None:
        if self.metrics is None:
            return
        w = self.window
        st = self._status() if self._store is not None else {"state": "idle"}
        self.metrics.publish({"state": st["state"], "window": w.progress.as_dict() if w else None,
                              "last_window": self.last, "aborts": dict(self._aborts), "stuck": self.stuck is not None})

    # --- the control socket --------------------------------------------------------------

    async def _serve(self, listener: anyio.abc.SocketListener) -> None:
        """Accepts control connections, at most `max_connections` served at once, and `priority_slots`
        more read for a `status` or `abort` alone (both fewer under a low RLIMIT_NOFILE). A failed
        accept (out of file descriptors, buffers) is logged and retried after a pause that doubles up
        to ACCEPT_BACKOFF_S[1]: never the end of the service, whose window must still restore."""
        assert self._tg is not None
        pause = ACCEPT_BACKOFF_S[0]
        async with listener:
            full = False
            while True:
                at_capacity = self.connections >= self.max_connections
                if at_capacity and not full:
                    full = True  # said once per episode: a flood must not flood the journal too
                    self.log.warning("control connections at capacity: idle ones make room, then status and abort "
                                     "take priority slots, then newcomers wait in the backlog",
                                     connections=self.connections, limit=self.max_connections,
                                     priority_limit=self.priority_slots)
                elif full and not at_capacity:
                    full = False
                    self.log.info("control connections below capacity again", connections=self.connections)
                if at_capacity and not self._idle and self.priority >= self.priority_slots:
                    # every slot busy: newcomers wait in the kernel's backlog, costing this process no
                    # file descriptor, until one frees
                    await anyio.sleep(0.05)
                    continue
                try:
                    conn = await listener.accept()
                except anyio.ClosedResourceError:
                    return
                except (OSError, anyio.BrokenResourceError) as exc:  # anyio wraps EMFILE in BrokenResourceError
                    cause = exc.__cause__ or exc
                    self.log.error("control socket accept failed; retrying", error=f"{type(cause).__name__}: {cause}",
                                   pause_s=pause)
                    await anyio.sleep(pause)
                    pause = min(pause * 2, ACCEPT_BACKOFF_S[1])
                    continue
                pause = ACCEPT_BACKOFF_S[0]
                if self.connections >= self.max_connections:
                    if self._idle:
                        # the oldest connection that is only waiting makes room: a crowd of idle
                        # connections can delay nobody's `status` or `abort`
                        self._idle.pop(next(iter(self._idle))).cancel()
                    else:
                        self.priority += 1
                        self._tg.start_soon(self._priority_client, conn)
                        continue
                self.connections += 1
                self._tg.start_soon(self._client, conn)

    async def _priority_client(self, conn: anyio.abc.SocketStream) -> None:
        """One command from a connection beyond the ordinary slots: answered if it is `status` or
        `abort`, refused otherwise; read within PRIORITY_READ_S."""
        pid, uid = _peer(conn)
        try:
            async with conn:
                with anyio.move_on_after(PRIORITY_READ_S):
                    line = await BufferedByteReceiveStream(conn).receive_until(b"\n", control.MAX_LINE)
                    try:
                        cmd = control.decode_command(line)
                    except BadCommand as exc:
                        await self._send(conn, control.error(str(exc)))
                        return
                    if not isinstance(cmd, (Status, Abort)):
                        await self._send(conn, control.error(
                            f"too many control connections (at most {self.max_connections}); only status and abort are "
                            f"answered now; try again"))
                        return
                    self.log.info("control command", cmd=type(cmd).__struct_config__.tag, uid=uid, pid=pid, priority=True)
                    await self._send(conn, await self._handle(cmd, uid, pid))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, anyio.IncompleteRead,
                anyio.DelimiterNotFound, TimeoutError, OSError):
            return
        finally:
            self.priority -= 1

    async def _client(self, conn: anyio.abc.SocketStream) -> None:
        pid, uid = _peer(conn)
        reader = BufferedByteReceiveStream(conn)
        key = object()
        try:
            async with conn:
                while True:
                    try:
                        with anyio.fail_after(IDLE_TIMEOUT_S) as idle:
                            self._idle[key] = idle
                            line = await reader.receive_until(b"\n", control.MAX_LINE)
                        self._idle.pop(key, None)
                        if idle.cancel_called:  # made room for a newer connection
                            return
                    except TimeoutError:
                        return  # idle: the slot goes to someone else
                    except anyio.IncompleteRead:
                        return
                    except anyio.DelimiterNotFound:
                        line = None
                    if line is None or len(line) > control.MAX_LINE:
                        # (a long line that arrived whole, newline included, is returned by receive_until)
                        self.log.warning("control line too long", uid=uid, pid=pid)
                        await self._send(conn, control.error(f"command line longer than {control.MAX_LINE} bytes"))
                        await _discard_rest(conn)
                        return
                    try:
                        cmd = control.decode_command(line)
                    except BadCommand as exc:
                        self.log.warning("bad control command", uid=uid, pid=pid, error=str(exc))
                        await self._send(conn, control.error(str(exc)))
                        continue
                    name = type(cmd).__struct_config__.tag
                    self.log.info("control command", cmd=name, uid=uid, pid=pid)
                    if isinstance(cmd, Watch):
                        if sum(self.watchers.values()) >= MAX_WATCHERS or self.watchers.get(uid, 0) >= MAX_WATCHERS_PER_UID:
                            await self._send(conn, control.error(
                                f"too many watch streams (at most {MAX_WATCHERS}, {MAX_WATCHERS_PER_UID} per user); "
                                f"`status` answers without one"))
                            return
                        self.watchers[uid] = self.watchers.get(uid, 0) + 1
                        try:
                            await self._watch(cmd, conn)
                        finally:
                            self.watchers[uid] -= 1
                        return
                    try:
                        answer = await self._handle(cmd, uid, pid)
                    except Exception as exc:  # the daemon's own failure (a log it cannot write): said, not fatal
                        self.log.exception("control command failed", cmd=name, uid=uid, pid=pid)
                        answer = control.error(f"{name} failed inside flare-diagd: {exc}")
                    await self._send(conn, answer)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, TimeoutError, OSError):
            return
        finally:
            self._idle.pop(key, None)
            self.connections -= 1

    @staticmethod
    async def _send(conn: anyio.abc.SocketStream, data: bytes) -> None:
        with anyio.fail_after(SEND_TIMEOUT_S):
            await conn.send(data)

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
            known = await _thread(_window_ids, self.db)
            if cmd.window_id not in known:
                return control.error(f"window {cmd.window_id!r}: not in this daemon's log")
            report = await _thread(build_report, self.db, cmd.window_id)
            return control.reply(window_id=cmd.window_id, format=cmd.format,
                                 content=render(report, cmd.format).decode())
        if isinstance(cmd, Archive):
            return await self._archive(cmd, uid, pid)
        if isinstance(cmd, control.ReviewSign):
            return await self._review_sign(cmd, uid)
        if isinstance(cmd, control.ReviewList):
            reviews = await _thread(self._reviews)
            return control.reply(reviews=[msgspec.to_builtins(r) for r in reviews])
        return control.error("unknown command")

    def _reviews(self) -> list:
        """Every review the daemon has recorded: in its log, and in the archives it moved closed windows to
        (a review signed before them went with them, and still admits its plan)."""
        archived = sorted((self.state_dir / "archive").glob("*.db")) if (self.state_dir / "archive").is_dir() else []
        return [r for db in (*archived, self.db) for r in reviews_in(db)]

    async def _review_sign(self, cmd, uid: int) -> bytes:
        """A review into the daemon's log, with the caller's uid: chained and audited like every event."""
        if not " ".join(cmd.by.split()) or len(cmd.by) > 200 or len(cmd.note) > 4000 or len(cmd.fixtures) > 64 \
                or not all(len(x) == 64 for x in (cmd.plan_sha256, *cmd.fixtures.values())):
            return control.error("review: expected a reviewer's name (at most 200 characters), a note of at most 4000, "
                                 "and sha256 digests of the plan and its fixtures' manifests")
        env = await self.store.append(ReviewSigned(subject="plan", plan_name=cmd.plan_name[:200], plan_sha256=cmd.plan_sha256,
                                                   author=cmd.author[:200], fixtures=cmd.fixtures,
                                                   by=" ".join(cmd.by.split()), note=cmd.note, uid=uid))
        self.log.info("review recorded", plan=cmd.plan_name[:200], by=cmd.by[:200], uid=uid, seq=env.seq)
        return control.reply(seq=env.seq, hash=env.hash.hex())

    async def _archive(self, cmd: Archive, uid: int, pid: int) -> bytes:
        """Archives the daemon's own log between windows: the archive is written from a read of the
        log, the hand-over is appended through the daemon's store (the chain keeps one writer), and
        only then are the archived rows dropped."""
        from flare_diag.events.archive import ArchiveError, drop_archived, hand_over, parse_day, prepare_archive
        if self.window is not None or self.starting or self.stopping:
            return control.error("a window is running; archive between windows", code="busy")
        try:
            before_ns = parse_day(cmd.before)
        except ArchiveError as exc:
            return control.error(str(exc))
        import time
        day = 86_400 * 10**9
        tomorrow = (time.time_ns() // day + 1) * day  # 00:00 UTC after today: "everything closed so far"
        if before_ns > tomorrow - self.archive_keep_days * day:
            # a socket-group member may tidy the log, never empty it of the recent windows an auditor reads
            return control.error(f"--before {cmd.before}: the daemon keeps the last {self.archive_keep_days} days in its "
                                 f"log (--archive-keep-days); expected a day at least that long ago")
        try:
            done = await _thread(prepare_archive, self.db, before_ns, self.state_dir / "archive", self.store.checkpoint_key)
        except ArchiveError as exc:
            return control.error(str(exc))
        if done is None:
            return control.reply(archive=None, windows=[])
        await self.store.append(hand_over(done))
        await self.store.append(ControlCommand(cmd="archive", uid=uid, pid=pid, ok=True,
                                               detail=f"{len(done.windows)} window(s) before {cmd.before} to {done.archive}"))
        await _thread(drop_archived, self.db, done)
        self.log.info("log archived", archive=done.archive, windows=done.windows, last_seq=done.last_seq, uid=uid, pid=pid)
        return control.reply(**msgspec.to_builtins(done))

    @property
    def store(self) -> EventStore:
        """The service's log: open from start() on, before any request, recovery or window."""
        if self._store is None:
            raise RuntimeError("flare-diagd's event log is not open yet")
        return self._store

    @store.setter
    def store(self, store: EventStore) -> None:
        self._store = store

    def _status(self) -> dict:
        w = self.window
        state = ("stopping" if self.stopping else "running") if w else "needs_attention" if self.stuck else "idle"
        needs = self.stuck
        window = w.progress.as_dict() if w else None
        if w is not None and w.runner.degraded:
            # the log takes nothing, so the progress it feeds has stopped: the policy in memory is the
            # truth now, and an operator must know at once what the log lacks
            pol = w.runner.policy
            held = sum(len(b) for b in w.runner.unlogged)
            what = "restored the host from memory" if pol.closed else f"is in its {pol.state.stage} from memory"
            needs = {"window_id": w.window_id,
                     "needs": f"the event log cannot be written ({w.runner.write_error}); the window {what}; {held} "
                              f"events are not in the log yet (appended if it takes them again)"}
            state = "needs_attention"
            window = {**(window or {}), "stage": pol.state.stage, "minute": pol.minute()}
        return {"state": state, "needs_attention": needs,
                "window": window, "last_window": self.last,
                "log": {"path": str(self.db), "head_seq": self.store.head[0]}, "pid": os.getpid(),
                "fleet": self.fleet.status() if self.fleet is not None else None}

    async def _start(self, cmd: Start, uid: int, pid: int, campaign_run: tuple[int, int, int] | None = None) -> bytes:
        if self.starting:
            # a second start while one is being checked: its lease and its window would be the first's
            return control.error("another start is being checked; one window at a time", code="busy")
        self.starting = True
        try:
            return await self._checked_start(cmd, uid, pid, campaign_run)
        finally:
            self.starting = False

    async def _published_elsewhere(self, w) -> str | None:
        """A window that closed from memory with its log's disk full: its log, completed from memory, and
        its reports in a fallback folder (daemon/reports/fallback.py), named in the journal; None when
        no folder took them."""
        from flare_diag.daemon.reports.fallback import complete_elsewhere
        with anyio.CancelScope(shield=True):
            done = await complete_elsewhere(self.db, w.window_id, w.runner.unlogged, durable=True)
        if done is None:
            self.log.error("no fallback folder took the window's log and reports", window_id=w.window_id)
            return None
        report, folder = done
        self.log.error("window's complete log and reports published elsewhere", window_id=w.window_id, folder=str(folder),
                       outcome=report.get("outcome"), restoration_verified=(report.get("restoration") or {}).get("verified"))
        return str(folder)

    async def _checked_start(self, cmd: Start, uid: int, pid: int, campaign_run: tuple[int, int, int] | None) -> bytes:
        busy = await self._why_not_now()
        if busy is not None:
            return busy
        if self.fleet is not None:  # a full pool is said before anything is read, not after
            refused = await self._fleet_gate(self.fleet.check_room(), uid, pid)
            if refused is not None:
                return refused
        try:  # the caller's plan and the operator's files: read here, nothing on the host yet
            setup = await self._setup(cmd)
        except InputError as exc:
            return self._refused(exc, uid, pid)
        window_id = new_window_id(setup.plan)
        grant: int | None = None  # the lease's fencing epoch, in a fleet
        if self.fleet is not None:
            # the lease before the host's reads: a start that would lose the pool's last slot sends the
            # primary no forecast probes, and a refused check gives the lease back (it never opened)
            refused = await self._fleet_gate(self.fleet.take_lease(window_id, f"uid {uid} pid {pid}"), uid, pid)
            if refused is not None:
                return refused
            grant = self.fleet.granted[window_id]
        session = WindowSession(setup)
        try:
            # the same read-only site check as `site check` (a site that lacks what the plan needs is refused
            # before anything on it changes), the preserved history hashed and the offline harness rehearsed,
            # then the forecast, whose probe requests go to the log as they are sent (intent, then answer):
            # outside any window, since none has opened yet (and it may be refused after its probe)
            earlier = await _thread(_earlier_window, self.db, setup.site.name)
            await session.prepare(Places(recipes=self.state_dir / "recipes", harness=self.state_dir / "harness" / window_id,
                                         outputs=[self.state_dir], harness_cache=harness_cache(self.state_dir),
                                         earlier=(self.db, earlier) if earlier else None), self.store.append)
        except BaseException as exc:
            self._lease_unused()
            if isinstance(exc, InputError):
                return self._refused(exc, uid, pid)
            raise
        if self.window is not None or self.stopping:  # a stop (or a resumed window) came while the host was read
            await session.close()
            self._lease_unused()
            return control.error("another window runs, or the daemon is stopping; no window starts")
        before = self._before_window(cmd, uid, pid, grant, campaign_run)
        try:
            w = await self._new_window(window_id, session, before)
        except BaseException:
            self._lease_unused()  # the log took none of it: the window never opened, and its lease follows that
            raise
        self._launch(w, w.session.run)
        if self.fleet is not None:
            self.fleet.launched()
        for warning in setup.site.warnings:
            self.log.warning("site profile warning", site=setup.site.name, warning=warning)
        self.log.info("window started", window_id=window_id, plan=setup.plan.name, site=setup.site.name,
                      rehearsal=setup.rehearsal, time_scale=setup.time_scale, uid=uid, pid=pid)
        return control.reply(window_id=window_id, rehearsal=setup.rehearsal)

    async def _why_not_now(self) -> bytes | None:
        """The refusal of any start now (the daemon stopping, a window running or left unfinished), or None."""
        if self.stopping:
            return control.error("the daemon is stopping; no window starts")
        if self.window is not None:
            return control.error(f"window {self.window.window_id} is running; one window at a time", code="busy")
        if self.stuck:
            return control.error(f"window {self.stuck['window_id']} is unfinished and not running: {self.stuck['needs']}")
        stuck = await _thread(open_window_ids, self.db)
        if stuck:
            # opened and never closed, and nothing is running it: its host may still be taken apart
            return control.error(f"window {stuck[0]} is unfinished in the log and not running; restore it "
                                 "(restart flare-diagd to resume it in its restore path) before a new window")
        return None

    async def _setup(self, cmd: Start) -> WindowSetup:
        """The window's setup from the caller's plan and the operator's files (InputError: refused as it is)."""
        setup = await _thread(setup_for_start, cmd.plan_toml.encode(), _label(cmd.plan_label), cmd.site,
                              self.sites_dir, cmd.time_scale, cmd.caller_fixtures)
        if cmd.calibration:
            setup.calibration = _calibration(cmd.calibration)
        setup.accept_partial = cmd.accept_partial
        setup.expected_incumbent = await _thread(unrestored_incumbent, self.db)
        check_review(setup, await _thread(self._reviews), "the daemon's log")
        return setup

    def _before_window(self, cmd: Start, uid: int, pid: int, grant: int | None,
                       campaign_run: tuple[int, int, int] | None) -> list[Event]:
        """What was done before the window opened, in its log before it: the lease's fencing epoch (in the
        chain before any host change), the campaign run this window is (in the host's own log, whatever
        the database heard), and the command that started it."""
        before: list[Event] = []
        if self.fleet is not None and grant is not None:
            before.append(LeaseGranted(pool=self.fleet.cfg.pool, host=self.fleet.cfg.host, epoch=grant, how="taken"))
        if campaign_run is not None:
            before.append(CampaignRunStarted(campaign=campaign_run[0], run=campaign_run[1], claim_us=campaign_run[2]))
        before.append(ControlCommand(cmd="start", uid=uid, pid=pid, ok=True,
                                     detail=f"plan {_label(cmd.plan_label)} site {cmd.site}"))
        return before

    def _refused(self, exc: InputError, uid: int, pid: int) -> bytes:
        # to the journal only: a refused command changes nothing, and a socket-group member must
        # not be able to grow the audit log without bound by sending bad ones
        self.log.warning("start refused", uid=uid, pid=pid, error=str(exc))
        return control.error(str(exc))

    def _lease_unused(self) -> None:
        """A lease taken for a start refused after it: the release follows the log (nothing opened)."""
        if self.fleet is not None:
            self.fleet.launched()

    def lease_lost(self, window_id: str, why: str) -> None:
        """The fleet database says the running window's lease is gone or another's: it aborts and restores."""
        w = self.window
        if w is not None and w.window_id == window_id:
            w.runner.abort(f"the fleet lease this window ran under was lost: {why}")

    async def start_run(self, run) -> dict:
        """A fleet campaign's run, started as an operator's `start` would be, by the daemon itself."""
        reply = await self._start(Start(plan_toml=run.plan_toml, site=run.site, plan_label=run.label,
                                        time_scale=run.time_scale, accept_partial=run.accept_partial),
                                  os.getuid(), os.getpid(), (run.campaign, run.run, run.claim_us))
        return msgspec.json.decode(reply)

    async def _fleet_gate(self, call, uid: int, pid: int) -> bytes | None:
        """The pool's room, or its lease, before anything changes: None when granted, else the refusal
        to send (exit 4 for a full pool, naming who holds it; exit 2 for a database that cannot say)."""
        from flare_diag.daemon.fleet.dsn import FleetError
        from flare_diag.daemon.fleet.lease import HeldByAnotherWindow, PoolFull
        code: str | None  # the refusal's class, where a caller acts on it
        try:
            with anyio.fail_after(self.fleet.cfg.lease_timeout_s):
                await call
            return None
        except (PoolFull, HeldByAnotherWindow) as exc:  # both pass: try again later
            why, code = str(exc), "busy"
        except TimeoutError:
            why, code = f"the fleet database did not answer within {self.fleet.cfg.lease_timeout_s:g} s", "fleet_unavailable"
        except FleetError as exc:
            why, code = str(exc), ("fleet_unavailable" if "cannot connect" in str(exc) else None)
        except Exception as exc:  # noqa: BLE001 - psycopg's errors and the network's: refused, never started
            why, code = (f"the fleet lease could not be taken ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})",
                         "fleet_unavailable")
        self.fleet.launched()
        self.log.warning("start refused: no fleet lease", uid=uid, pid=pid, pool=self.fleet.cfg.pool, error=why)
        extra = {"code": code} if code else {}
        return control.error(f"no fleet lease for pool {self.fleet.cfg.pool}: {why}", **extra)

    async def _watch(self, cmd: Watch, conn: anyio.abc.SocketStream) -> None:
        """Streams committed events as JSON lines: the backlog from `from_seq`, then each commit."""
        send, receive = anyio.create_memory_object_stream[list[Envelope]](WATCH_BACKLOG)
        behind = False

        def push(envs: list[Envelope]) -> None:
            nonlocal behind
            try:
                send.send_nowait(envs)
            except anyio.WouldBlock:  # fell too far behind: end the stream rather than grow without bound
                behind = True
                unsubscribe()
                send.close()

        unsubscribe = self.store.subscribe(push)
        head = self.store.head[0]
        try:
            start = cmd.from_seq
            if start is None:
                wid = self.window.window_id if self.window else (self.last or {}).get("window_id")
                start = await _thread(_first_seq, self.db, wid) if wid else head + 1
            sent = start - 1
            backlog = [control.reply(watching=True, from_seq=start)]
            for env in await _thread(_envelopes_between, self.db, start, head):
                backlog.append(_event_line(env))
                sent = env.seq
            await self._send(conn, b"".join(backlog))
            if self.window is None:  # nothing will close: say so, rather than stream nothing for ever
                # the window may have closed since `head` was read: its last events (its close among
                # them) are committed by now, and go before the word that nothing is running
                late = await _thread(_envelopes_between, self.db, sent + 1, self.store.head[0])
                if late:
                    await self._send(conn, b"".join(_event_line(e) for e in late))
                last = self.last or {}
                await self._send(conn, control.reply(watching=False, window_id=last.get("window_id"),
                                                     outcome=last.get("outcome")))
                return
            async with receive:
                async for envs in receive:
                    lines = [_event_line(e) for e in envs if e.seq > sent]
                    if lines:
                        sent = envs[-1].seq
                        await self._send(conn, b"".join(lines))
            if behind:
                await self._send(conn, control.error("watch fell too far behind; reconnect with from_seq", from_seq=sent + 1))
        finally:
            unsubscribe()


async def _discard_rest(conn: anyio.abc.SocketStream, limit: int = 4 * control.MAX_LINE) -> None:
    """Reads (briefly, boundedly) what a refused client still sends, so that closing does not reset
    the connection before it has read the reply."""
    await conn.send_eof()
    with anyio.move_on_after(1):
        n = 0
        while n < limit:
            n += len(await conn.receive())


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


def _earlier_window(db: Path, site: str) -> str | None:
    """The last window of `site` this log closed (the reproducer's fit starts from it), or None."""
    with LogReader(db) as r:
        closed = {env.window_id for env in r.iter(types=["window_closed"])}
        opened = [env for env in r.iter(types=["window_opened"]) if env.window_id in closed]
    mine = [env.window_id for env in opened if getattr(env.event(), "site", None) == site]
    return mine[-1] if mine else None


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


def _label(plan_label: str) -> str:
    """The caller's name for its plan, for messages: printable, bounded, never opened."""
    return "".join(c if c.isprintable() else "?" for c in plan_label[:200]) or "plan"


def _calibration(raw: dict):
    from flare_diag.policies.calibration import CalibrationError, check_calibration
    from flare_diag.policies.planner import Calibration
    try:
        return check_calibration(msgspec.convert(raw, Calibration), "start")
    except msgspec.ValidationError as exc:
        raise InputError(f"calibration: {exc}") from None
    except CalibrationError as exc:
        raise InputError(str(exc)) from None


KEY_CREDENTIAL = "checkpoint.key"


def checkpoint_key() -> bytes | None:
    """The checkpoint signing key, when the unit hands one over (LoadCredential=checkpoint.key:...)."""
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if not creds:
        return None
    try:
        key = (Path(creds) / KEY_CREDENTIAL).read_bytes().strip()
    except OSError:
        return None
    return key or None


def log_problem_at_start(db: Path, key: bytes | None) -> str | None:
    """Why the daemon must not append to this log, or None: a chain that does not verify, a
    checkpoint that is missing, unreadable, unsigned or wrongly signed (when a key is configured)."""
    from flare_diag.events.checkpoint import BadCheckpoint, default_path, mac_ok, read_checkpoint
    from flare_diag.events.sqlschema import NotAnEventLog
    from flare_diag.events.verify import verify_log
    if not db.exists():
        return None
    try:
        cp = read_checkpoint(default_path(db))
        with LogReader(db) as r:
            res = verify_log(r, cp)
            events = res.events
    except (BadCheckpoint, NotAnEventLog) as exc:
        return str(exc)
    if not res.ok:
        return f"the chain does not verify at seq {res.first_bad_seq}: {res.problem}"
    if events and cp is None:
        return (f"{events} events and no checkpoint beside them: a log whose checkpoint was removed cannot be told "
                f"from a truncated one")
    if key is not None and cp is not None:
        if not cp.mac:
            return "the checkpoint is not signed, and a signing key is configured"
        if not mac_ok(cp, key):
            return "the checkpoint's signature does not verify under the configured key (rewritten?)"
    return None


def _peer(conn: anyio.abc.SocketStream) -> tuple[int, int]:
    """(pid, uid) of a control connection's caller (SO_PEERCRED), or (-1, -1) when it cannot be read."""
    try:
        pid, uid, _gid = control.peer_credentials(conn.extra(anyio.abc.SocketAttribute.raw_socket))
    except (OSError, anyio.TypedAttributeLookupError):
        return -1, -1
    return pid, uid


def _loopback(host: str) -> bool:
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="flare-diagd", description="the flare-diag service")
    ap.add_argument("--socket", type=Path, default=None, help="control socket (default: $RUNTIME_DIRECTORY/control.sock)")
    ap.add_argument("--state-dir", type=Path, default=None, help="log and reports (default: $STATE_DIRECTORY)")
    ap.add_argument("--sites-dir", type=Path, default=None,
                    help="the site profiles windows may run against, by name (default: $FLARE_DIAG_SITES, "
                         "else /etc/flare-diag/sites); installed by the operator")
    ap.add_argument("--trust-log", action="store_true",
                    help="append to the log even though its checkpoint is missing, unsigned or does not verify "
                         "(once, after a person has checked it)")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                    help="the least severe level the service logs (default info)")
    ap.add_argument("--metrics-address", default=None, metavar="HOST:PORT",
                    help="serve the daemon's own Prometheus metrics there (window state and phase, aborts by reason, "
                         "last outcome, restoration verified, primary_left_quiesced); off by default")
    ap.add_argument("--archive-keep-days", type=int, default=ARCHIVE_KEEP_DAYS, metavar="N",
                    help=f"`log archive` over the control socket must leave the last N days in the log "
                         f"(default {ARCHIVE_KEEP_DAYS}); the offline `log archive DB` is the owner's and has no such bound")
    ap.add_argument("--metrics-allow-remote", action="store_true",
                    help="let --metrics-address bind an address that is not loopback (the metrics carry no secret "
                         "but have no authentication: put them behind a firewall or a proxy that authenticates; "
                         "docs/operations.md); off by default")
    ap.add_argument("--fleet", type=Path, default=None, metavar="FILE",
                    help="fleet settings (TOML: dsn, host, pool; docs/fleet.md): ship every event to the fleet's "
                         "PostgreSQL and take the pool's lease before each window; off by default")
    return ap


def _unusable_folder(path: Path) -> str | None:
    """Why the daemon cannot keep its state in `path` (it makes a missing one), or None."""
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                return "not a folder" if part == path else f"{part} is a file, not a folder"
            if os.access(part, os.W_OK | os.X_OK):
                return None
            return "not writable by this user" if part == path else f"cannot be made: {part} is not writable by this user"
    return None


class _Refused(Exception):
    """A flag the daemon cannot start with: said in one line, exit 2, nothing started."""


def _fleet_config(a: argparse.Namespace) -> tuple[FleetConfig | None, str]:
    """The fleet's configuration and its connection string (None, "" without --fleet)."""
    if a.fleet is None:
        return None, ""
    from flare_diag.daemon.fleet.config import load_config
    from flare_diag.daemon.fleet.dsn import FleetError, conninfo
    try:
        cfg = load_config(a.fleet)
        return cfg, conninfo(cfg.dsn, cfg.password_file)
    except FleetError as exc:
        raise _Refused(f"--fleet {a.fleet}: {exc}") from None


def _metrics_server(a: argparse.Namespace, log: Any) -> ServiceMetrics | None:
    """The service's own /metrics, serving on --metrics-address (None without it)."""
    if a.metrics_address is None:
        return None
    from flare_diag.daemon.service.exporter import ServiceMetrics, parse_address
    try:
        host, port = parse_address(a.metrics_address)
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    if not _loopback(host) and not a.metrics_allow_remote:
        raise _Refused(f"--metrics-address {a.metrics_address}: {host} is not a loopback address; the metrics have no "
                       f"authentication, so a remote bind needs --metrics-allow-remote")
    metrics = ServiceMetrics()
    try:
        host, port = metrics.serve(host, port)
    except OSError as exc:
        raise _Refused(f"--metrics-address {a.metrics_address}: {exc.strerror or exc}") from None
    log.info("metrics serving", address=f"{host}:{port}")
    return metrics


def _state_folder(a: argparse.Namespace) -> Path:
    if not 0 <= a.archive_keep_days <= 36_500:
        raise _Refused(f"--archive-keep-days {a.archive_keep_days}: expected 0 to 36500")
    state_dir: Path = a.state_dir or default_state_dir()
    why = _unusable_folder(state_dir)
    if why:
        raise _Refused(f"--state-dir {state_dir}: {why}")
    return state_dir


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    log = configure(a.log_level)
    metrics = None
    try:
        fleet_cfg, dsn = _fleet_config(a)
        metrics = _metrics_server(a, log)
        state_dir = _state_folder(a)
    except _Refused as exc:
        print(f"flare-diagd: error: {exc}", file=sys.stderr)
        if metrics is not None:
            metrics.close()
        return 2
    fleet = None
    svc: Service  # the fleet link's window reader below asks it once it exists
    if fleet_cfg is not None:
        from flare_diag.daemon.service.fleetlink import FleetLink
        fleet = FleetLink(fleet_cfg, dsn, state_dir / "log.db", log, lambda: svc.window.window_id if svc.window else None)
    svc = Service(state_dir, a.socket or default_socket(), log, Notifier(), a.sites_dir,
                  a.trust_log, metrics, a.archive_keep_days, fleet)
    if fleet is not None:
        if metrics is not None:
            metrics.fleet = fleet.status
        fleet.starter = svc.start_run
        fleet.idle = lambda: svc.window is None and svc.stuck is None and not svc.stopping
        fleet.lease_lost = svc.lease_lost
    try:
        return anyio.run(svc.run)
    except Exception as exc:
        log.exception("flare-diagd failed", error=str(exc))
        return 1
    finally:
        if metrics is not None:
            metrics.close()


if __name__ == "__main__":
    sys.exit(main())
