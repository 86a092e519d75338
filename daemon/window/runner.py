"""The runner: the only place that reads the clock and does I/O for a window.

Each input is appended before the policy sees it; each decision is appended (and, when it has a
side effect, made durable) before it is carried out; each action's outcome comes back as an input.
One anyio task group per window holds the watchers and every action, each action in its own
cancel scope with its deadline; nothing the window started outlives it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import anyio
import anyio.abc
import msgspec

from flare_diag.daemon.hosts.bounds import StallBound
from flare_diag.daemon.hosts.errors import ActionFailed, classify_exception, why_unread
from flare_diag.daemon.hosts.site import scrub
from flare_diag.daemon.hosts.target import Target
from flare_diag.events.base import Event
from flare_diag.events.schema import (
    ActionDone, ActionRequested, CancelRequested, DaemonRestarted, Decision, Input, LogUnwritable, OperatorAbort,
    RequestDone, Tick, WatchFailed, WatchObserved, WindowClosed, WindowOpened,
)
from flare_diag.events.stages import BEFORE_RESTORE
from flare_diag.events.store import EventStore, StoreWriteError
from flare_diag.policies import rules
from flare_diag.policies.audit import WindowReplay
from flare_diag.policies.scaling import STALL_MIN_REAL_S, effective_s
from flare_diag.policies.window import WindowPolicy

MIN_REAL_DEADLINE_S = 5.0  # no action or poll of a scaled (simulated) window gets less real time than this
# the calls that go to the engine itself (its serving port): one that fails in transport, gets no answer
# within its deadline, or whose stream stalls is followed by /health (rules.ASK_HEALTH_AFTER)
ENGINE_CALLS = ("send_request", "scrape_metrics", "read_identity")
WATCH_EVERY_S = 5.0  # window seconds between GPU and router polls
CATCH_UP_EVERY_S = 1.0  # real seconds between attempts to append what a failing log did not take
FINAL_CATCH_UP_S = 20.0  # real seconds a closed window keeps trying before it says what the log lacks

_log = logging.getLogger("flare_diag.runner")


class Runner:
    def __init__(self, store: EventStore, target: Target, window_id: str, time_scale: float = 1.0,
                 on_decision: Callable[[Decision], None] | None = None) -> None:
        self.store = store
        self.target = target
        self.window_id = window_id
        self.scale = time_scale
        self.policy = WindowPolicy()
        self.handlers = target.handlers()  # action type -> the Target method that carries it out
        # inputs are never dropped: the stream is unbounded, and only this runner's tasks send on it
        self._send, self._receive = anyio.create_memory_object_stream[Input](math.inf)
        self.scopes: dict[int, anyio.CancelScope] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self.on_decision = on_decision or (lambda d: None)
        self._start = anyio.current_time()  # the loop's clock: real seconds, or a rehearsal's virtual ones
        self._last: list[Decision] = []
        self.outcome: str | None = None
        self.write_error: BaseException | None = None
        # what the store has not acknowledged, in submission order; on a failed commit it becomes
        # `unlogged` and the window goes on from memory (`degraded`) until the log takes it again
        self._unacked: deque[tuple[asyncio.Future[Any], list[Event]]] = deque()  # a commit's future, its events
        self.unlogged: list[list] = []
        self.degraded = False
        self._catching_up = False

    def now(self) -> int:
        """The window clock: nanoseconds since the window opened on the loop's clock, times the time
        scale. The loop's clock is the monotonic clock, or in a rehearsal the simulator's virtual time
        (daemon/rehearsal/virtualtime.py), which the runner cannot tell apart and need not."""
        return int((anyio.current_time() - self._start) * 1e9 * self.scale)

    async def run(self, opened: WindowOpened) -> str:
        return await self._loop(opened)

    async def resume(self, recorded: list[tuple[int, Event]], opened_wall_ns: int, mismatches: list[str] | None = None) -> str:
        """Picks up a window the daemon left unfinished: replays its recorded inputs into a fresh
        policy (nothing is carried out again), compares each replayed decision with the one the log
        holds, then reports the restart, which sends the window to restore. What differs (here, or
        in the files the caller compared) goes with the restart and raises `resume_mismatch`."""
        # The window clock keeps counting through the outage: a crash does not stop the minutes.
        elapsed = max(0, time.time_ns() - opened_wall_ns)
        self._start = anyio.current_time() - elapsed / 1e9
        found = list(mismatches or [])
        divergence = replay(self.policy, recorded)
        if divergence:
            found.append(divergence)
        return await self._loop(DaemonRestarted(at_ns=max(self.now(), self.policy.now), unanswered=sorted(self.policy.state.asked),
                                                mismatches=found))

    def abort(self, reason: str, uid: int | None = None, pid: int | None = None) -> None:
        """An operator's abort: queued as an input like any observation."""
        self._send.send_nowait(OperatorAbort(at_ns=self.now(), reason=reason, uid=uid, pid=pid))

    async def _loop(self, first: Input) -> str:
        failure: BaseException | None = None
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._watch)
            try:
                await self.feed(first)
                self._bound_stalls()
                if self.target.prometheus is not None:  # the plan's guards are known once the first input is in
                    tg.start_soon(self._watch_guards)
                while not self.policy.closed:
                    if self.write_error is not None and not self.degraded:
                        self._degrade()
                    wake = self.policy.next_wakeup_ns()
                    inp: Input | None = None
                    with anyio.move_on_after(None if wake is None else max(0.0, (wake - self.now()) / self.scale / 1e9)):
                        inp = await self._receive.receive()
                    await self.feed(inp if inp is not None else Tick(at_ns=max(self.now(), wake or 0)))
            except Exception as exc:  # raised as itself, not inside the task group's ExceptionGroup
                failure = exc
            finally:
                tg.cancel_scope.cancel()  # the watchers, and any action still out, end with the window
        self._tg = None
        await self.store.flush()
        if self.write_error is not None and not self.degraded:  # the close itself (or what led to it) failed
            self.degraded = True
            self.unlogged = [ev for fut, ev in self._unacked
                             if not (fut.done() and not fut.cancelled() and fut.exception() is None)]
            self._unacked.clear()
        if self.degraded and failure is None:  # what the log did not take is appended, if it takes it in time
            with anyio.move_on_after(FINAL_CATCH_UP_S):
                while self.degraded:
                    await self._catch_up()
                    if self.degraded:
                        await anyio.sleep(CATCH_UP_EVERY_S)
        closed = [d for d in self._last if isinstance(d, WindowClosed)]
        if failure is None and self.policy.closed:
            self.outcome = closed[-1].outcome if closed else "aborted"
        if failure is None and self.degraded:
            n = sum(len(b) for b in self.unlogged)
            _log.error("window %s closed (%s) with %d events its log could not take: %s", self.window_id, self.outcome,
                       n, [type(e).__name__ for b in self.unlogged for e in b][:200])
            failure = StoreWriteError(f"window {self.window_id} closed ({self.outcome}), restored from memory, but its "
                                      f"last {n} events are not in the log: {self.write_error}")
        if failure is not None:
            raise failure
        return self.outcome  # type: ignore[return-value]  # set by the time the task group exits without a failure

    async def feed(self, inp: Input) -> None:
        decisions = self.policy.receive(inp)
        self._last = decisions
        events = [inp, *decisions]
        if self.degraded:  # the log takes nothing: kept in order, appended once it does
            self.unlogged.append(events)
        else:
            fut = self.store.submit_many(events, window_id=self.window_id, caused_by_first=True)
            self._unacked.append((fut, events))
            fut.add_done_callback(self._written)
            if any(isinstance(d, (ActionRequested, CancelRequested)) for d in decisions):
                try:
                    await fut  # a decision is durable before it is carried out
                except StoreWriteError:
                    # not durable, so not carried out: each action comes back failed, and the window
                    # turns to its restore from memory
                    self._degrade()
                    for d in decisions:
                        if isinstance(d, ActionRequested):
                            self._send.send_nowait(self._failed(d, "not_carried_out",
                                                                "its decision could not be written to the event log"))
                        elif isinstance(d, CancelRequested):
                            self._cancel(d)
                    return
        for d in decisions:
            self.on_decision(d)
            if isinstance(d, ActionRequested):
                scope = self.scopes[d.action_id] = anyio.CancelScope()
                self._tg.start_soon(self._execute, d, scope)  # type: ignore[union-attr]  # the task group is open for as long as decisions are executed
            elif isinstance(d, CancelRequested):
                self._cancel(d)

    def _cancel(self, d: CancelRequested) -> None:
        for aid in d.action_ids:
            sc = self.scopes.get(aid)
            if sc is not None:
                sc.cancel()

    def _written(self, fut) -> None:
        if fut.cancelled():
            return
        if fut.exception() is not None:
            if self.write_error is None:
                self.write_error = fut.exception()
            return
        while self._unacked and self._unacked[0][0].done() and not self._unacked[0][0].cancelled() \
                and self._unacked[0][0].exception() is None:
            self._unacked.popleft()

    def _degrade(self) -> None:
        """The log failed a commit (and, fail-stop, takes nothing after it): everything not yet
        acknowledged is kept in memory, in order; the policy hears of it (an input), and goes to its
        restore, carried out without waiting for the log; a background task appends what is kept
        once the log takes it again."""
        if self.degraded:
            return
        self.degraded = True
        self.write_error = self.write_error or self.store.failed
        self.unlogged = [ev for fut, ev in self._unacked
                         if not (fut.done() and not fut.cancelled() and fut.exception() is None)]
        self._unacked.clear()
        _log.error("event log write failed in window %s: going on from memory into the restore: %s",
                   self.window_id, self.write_error)
        self._send.send_nowait(LogUnwritable(at_ns=self.now(), detail=str(self.write_error)))
        self._tg.start_soon(self._catch_up_loop)  # type: ignore[union-attr]  # the task group is open for as long as decisions are executed

    async def _catch_up_loop(self) -> None:
        while self.degraded:
            await anyio.sleep(CATCH_UP_EVERY_S)
            await self._catch_up()

    async def _catch_up(self) -> None:
        """Appends what the log did not take, oldest first, one submission at a time."""
        if self._catching_up:
            return
        self._catching_up = True
        try:
            await self.store.flush()  # whatever was queued before the failure has failed by now
            self.store.resume_writes()
            while self.unlogged:
                try:
                    await self.store.submit_many(self.unlogged[0], window_id=self.window_id, caused_by_first=True)
                except StoreWriteError:
                    return
                self.unlogged.pop(0)
            self.degraded, self.write_error = False, None
            _log.warning("event log of window %s writable again: every event kept in memory is appended", self.window_id)
        finally:
            self._catching_up = False

    async def _execute(self, d: ActionRequested, scope: anyio.CancelScope) -> None:
        fn = self.handlers[type(d.request)]
        res: Input | None = None
        with scope:
            try:
                with anyio.fail_after(self._real_s(d.deadline_s) if d.deadline_s else None):
                    data = await fn(d.args)
                if d.action == "send_request":
                    if data.get("response_head"):
                        data["response_head"] = scrub(data["response_head"], self.target.site.tokens.values())
                    res = RequestDone(at_ns=self.now(), action_id=d.action_id, **_req_ids(d.args), **data)
                else:
                    res = ActionDone(at_ns=self.now(), action_id=d.action_id, ok=True, data=data)
            except TimeoutError:
                res = await self._failed_asking(d, ActionFailed("timeout", f"{d.action}: no answer within its deadline "
                                                                           f"of {d.deadline_s:g} s"))
            except Exception as exc:  # every outcome, failure included, goes back to the policy
                res = await self._failed_asking(d, classify_exception(exc, d.action))
        self.scopes.pop(d.action_id, None)
        if res is None:  # its scope was cancelled: by the policy, or because the window ended
            res = self._failed(d, "cancelled", "cancelled by the policy", cancelled=True)
        self._send.send_nowait(res)

    async def _failed_asking(self, d: ActionRequested, f: ActionFailed) -> Input:
        """A failed action's answer. A call to the engine lost or refused, unanswered, or whose stream stalled is
        followed at once by /health, within the action's own deadline, so that the policy can tell an engine
        that is gone (or holds its work and does not progress) from a broken transport or a slow answer. Not
        once the restore has begun: it judges a failed read as a failed read, and the ask would only spend
        its reservation."""
        ask = f.error in rules.ASK_HEALTH_AFTER and d.action in ENGINE_CALLS and self.policy.state.stage in BEFORE_RESTORE
        health = await self._health_now(self._real_s(d.deadline_s) if d.deadline_s else None) if ask else None
        return self._failed(d, f.error, f.detail, status=f.status, health_after=health)

    def _failed(self, d: ActionRequested, error: str, detail: str, cancelled: bool = False,
                status: int | None = None, health_after: int | str | None = None) -> Input:
        detail = scrub(detail, self.target.site.tokens.values())  # a host may echo a token in its error body
        if d.action == "send_request":
            return RequestDone(at_ns=self.now(), action_id=d.action_id, **_req_ids(d.args),
                               outcome="cancelled" if cancelled else "error", error=None if cancelled else error,
                               detail=detail, status_code=status, health_after=health_after)
        return ActionDone(at_ns=self.now(), action_id=d.action_id, ok=False, error=error, detail=detail,
                          health_after=health_after)

    async def _watch(self) -> None:
        """Polls the GPU view and the router every WATCH_EVERY_S window seconds, each watch in a task
        of its own with a deadline per poll, so a hung router cannot silence the GPU watch (nor the
        reverse). Every answer is an input (the policy judges GPU memory, Xids and containment on
        each), and so is every poll that got none: the policy aborts with `watch_lost` when a watch
        it depends on stays silent."""
        async with anyio.create_task_group() as tg:
            if self.target.host.gpu.present:
                tg.start_soon(self._watch_gpu)
            if self.target.host.router.present:
                tg.start_soon(self._watch_router)
            tg.start_soon(self._watch_identity)

    def _bound_stalls(self) -> None:
        """The plan's stall bound on every generation's stream, once the plan is known (the first input)."""
        if self.policy.plan is not None:
            planned = self.policy.plan.timing.stall_s
            window_s = effective_s(planned, STALL_MIN_REAL_S, self.scale) if self.scale > 1 else planned
            self.target.stall = StallBound(window_s / self.scale, window_s, planned)

    def _poll_window_s(self) -> float:
        """A watch's read deadline in window seconds: the plan's action timeout."""
        t = self.policy.plan.timing if self.policy.plan is not None else None
        return t.action_timeout_s if t else 60.0

    def _poll_deadline_s(self) -> float:
        return self._real_s(self._poll_window_s())

    def _real_s(self, window_s: float) -> float:
        """A deadline in real seconds: the window's, divided by the time scale, but never below
        MIN_REAL_DEADLINE_S when the clock is scaled (a simulated site only): at x100, 60 window
        seconds are 0.6 real ones, which a loaded machine's scrape can take."""
        real = window_s / self.scale
        return max(real, min(window_s, MIN_REAL_DEADLINE_S)) if self.scale > 1 else real

    async def _watch_gpu(self) -> None:
        seen_xids: int | None = None
        while True:
            await anyio.sleep(WATCH_EVERY_S / self.scale)
            try:
                with anyio.fail_after(self._poll_deadline_s()):
                    g = await self.target.gpu_view()
                xids = g.get("xid_events") or []
                new = xids[seen_xids:] if seen_xids is not None else []
                seen_xids = len(xids)
                data = {"xid_events": new, "gpus": g.get("gpus", [])}
                for k in ("unsupported", "xid_watch_error"):
                    if g.get(k):
                        data[k] = g[k]
                self._send.send_nowait(WatchObserved(at_ns=self.now(), source="gpu", data=data))
            except Exception as exc:
                self._send.send_nowait(self._watch_failed("gpu", exc))

    async def _watch_router(self) -> None:
        while True:
            await anyio.sleep(WATCH_EVERY_S / self.scale)
            polled = self.now()
            try:
                with anyio.fail_after(self._poll_deadline_s()):
                    r = await self.target.snapshot({"what": "router"})
                # when the poll was sent: an answer to a poll sent before the quiesce took effect says
                # nothing about containment after it
                self._send.send_nowait(WatchObserved(at_ns=self.now(), source="router", data={**r, "polled_at_ns": polled}))
            except Exception as exc:
                self._send.send_nowait(self._watch_failed("router", exc))

    async def _watch_identity(self) -> None:
        """The serving identity between a phase's own reads (a read, no generation): at C4 a round of
        requests can last many seconds, and a drift inside it must not wait for the round's end."""
        while True:
            await anyio.sleep(WATCH_EVERY_S / self.scale)
            polled = self.now()
            try:
                with anyio.fail_after(self._poll_deadline_s()):
                    ident = await self.target.read_identity({})
                data = {"identity": ident, "polled_at_ns": polled}
                if ident.get("incarnation") is None:  # gone, or only its identity blank: /health tells which
                    data["health"] = await self._health_now()
                self._send.send_nowait(WatchObserved(at_ns=self.now(), source="identity", data=data))
            except Exception as exc:
                self._send.send_nowait(self._watch_failed("identity", exc))

    async def _health_now(self, limit_s: float | None = None) -> int | str:
        """/health asked once, after a read of the engine found it gone or failed in transport: its status, or
        why it could not be read ("no connection": nothing accepted one; else the failure's class), within
        `limit_s` real seconds when it is shorter than a watch's poll."""
        try:
            with anyio.fail_after(min(self._poll_deadline_s(), limit_s or math.inf)):
                return int((await self.target.health({}))["status"])
        except Exception as exc:
            return why_unread(exc, "health")  # never the host's words: a class, as an action's error is

    async def _watch_guards(self) -> None:
        """Each steady-state guard evaluated every `interval_s` window seconds, a task per guard, each
        evaluation an input (a failed one a WatchFailed of source `prometheus`, naming the guard)."""
        if self.policy.plan is None or not self.policy.steady_state:
            return
        async with anyio.create_task_group() as tg:
            for g in self.policy.plan.guards:
                tg.start_soon(self._watch_guard, g)

    async def _watch_guard(self, g) -> None:
        prom = self.target.prometheus
        while True:
            await anyio.sleep(g.interval_s / self.scale)
            polled = self.now()
            try:
                with anyio.fail_after(self._poll_deadline_s()):
                    r = await prom.query(g.query)  # type: ignore[union-attr]  # reached only with a Prometheus configured for the guards
                self._send.send_nowait(WatchObserved(at_ns=self.now(), source="prometheus",
                                                     data={"guard": g.name, **r, "polled_at_ns": polled}))
            except Exception as exc:
                f = self._watch_failed("prometheus", exc)
                self._send.send_nowait(msgspec.structs.replace(f, detail=f"guard {g.name}: {f.detail}"))

    def _watch_failed(self, source: str, exc: Exception) -> WatchFailed:
        if isinstance(exc, TimeoutError):  # the watch's own deadline: the host held the read, not this daemon's bug
            f = ActionFailed("timeout", f"{source} watch: no answer within its deadline of {self._poll_window_s():g} s")
        else:
            f = classify_exception(exc, f"{source} watch")
        return WatchFailed(at_ns=self.now(), source=source, error=f.error,
                           detail=scrub(f.detail, self.target.site.tokens.values()))


def replay(policy: WindowPolicy, recorded: Iterable[tuple[int, Event]]) -> str | None:
    """Feeds a window's recorded (seq, event)s to `policy` (policies/audit.py's replayer, following the
    log to its end whatever the policy decides); the first replayed decision that is not the recorded
    one, described, or None when every decision matched."""
    r = WindowReplay(policy, follow=True)
    for seq, ev in recorded:
        r.feed(seq, "", ev)
    r.end("")
    d = r.divergence
    if d is None:
        return None
    inputs, tag = r.parted_after
    return (f"replayed decisions differ from the recorded ones at seq {d.seq}, after input {inputs} ({tag}): "
            f"this build decides {d.expected}, the log holds {d.found}")


def _req_ids(args: dict) -> dict:
    return {"phase": args["phase"], "order_index": args["order_index"], "body_index": args["body_index"],
            "body_sha256": args["body_sha256"]}
