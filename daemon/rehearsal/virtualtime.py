"""Virtual time for rehearsals: an asyncio loop whose clock moves only when everything in it waits.

A rehearsal's window clock is the simulator's model of service time, not the machine's: the same
plan, scenario, faults and seed give the same window on any machine under any load. The loop's
`time()` is virtual. When no callback is ready and no work is out on a thread, the loop jumps its
clock to the next timer instead of sleeping, so a 90-minute window takes as long as its CPU work.

Work on another thread would break this twice over: the clock could jump while the thread still
works (an event log commit would then seem to take minutes, or none), and its answer would land
at whatever point the loop had reached (the order of same-instant events would follow the
machine's scheduling). So:
- `run_in_executor` (and so `asyncio.to_thread`) runs its function inline: blocking the loop costs
  real seconds but no virtual ones;
- a call handed to a thread the loop does not own (the event store's database thread) is announced with
  `thread_call_started()`; answers from other threads (`call_soon_threadsafe`) are held in an inbox
  and delivered only once the loop is idle at the current instant and every announced call has
  answered, in the order they answered (the store's one thread answers in the order it was asked);
  only then may the clock move on.

Why a loop and not trio's MockClock: the event store answers on an asyncio loop from its own thread,
and an autojumping clock would jump while a commit is out on it. Why not an injected clock alone: anyio's
deadlines and sleeps read the loop's clock, so every `fail_after` and `sleep` in the runner and the
in-process simulator is virtual with no change to them. `policies/` never sees any of this: it only
reads `at_ns`.
"""

from __future__ import annotations

import asyncio
import selectors
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# a thread that never answers would otherwise hang the rehearsal with no word; this is real time
THREAD_ANSWER_WAIT_S = 120.0


class _Selector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]  # DefaultSelector is a platform alias mypy cannot subclass
    """The loop's selector; where the loop would wait for a timer, it moves the virtual clock instead."""

    loop: VirtualTimeLoop

    def select(self, timeout: float | None = None) -> list:
        loop = self.loop
        if timeout is not None and timeout <= 0:
            return super().select(0)  # callbacks are ready: only real I/O is polled
        # idle at this instant: the threads' answers first, then the outside world, then the clock
        loop._await_threads()
        if loop._deliver():
            return super().select(0)
        events = super().select(0)  # level-triggered: what became ready during the wait is still ready
        if events:
            return events
        if timeout is None:
            return super().select(None)  # no timer: only the outside world can wake the loop
        loop._now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on a virtual clock (seconds from 0) that jumps to its next timer when idle."""

    def __init__(self) -> None:
        sel = _Selector()
        super().__init__(selector=sel)
        sel.loop = self
        self._now = 0.0
        self._inbox: deque[asyncio.Handle] = deque()
        self._lock = threading.Lock()
        self._answer = threading.Condition(self._lock)  # notified by each answer from a thread
        self._announced = 0  # thread calls announced
        self._answered = 0  # answers from threads received (held in the inbox until delivered)

    def time(self) -> float:
        return self._now

    # --- threads
    def thread_call_started(self) -> None:
        """A caller hands one call to a thread; the clock waits for its answer (see the module doc)."""
        with self._lock:
            self._announced += 1

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any,  # type: ignore[override]  # typeshed's TypeVarTuple signature; this takes what it takes
                             context: Any = None) -> asyncio.Handle:
        if threading.get_ident() == self._thread_id:  # type: ignore[attr-defined]  # BaseEventLoop's own thread id, private  # the loop's own thread (an async generator's finalizer)
            return super().call_soon_threadsafe(callback, *args, context=context)
        self._check_closed()  # type: ignore[attr-defined]  # BaseEventLoop's private check, as its own call_soon_threadsafe makes
        handle = asyncio.Handle(callback, args, self, context)
        with self._answer:
            self._inbox.append(handle)
            self._answered += 1
            self._answer.notify()
        self._write_to_self()  # type: ignore[attr-defined]  # the selector loop's self-pipe wake-up, private
        return handle

    def _await_threads(self) -> None:
        """Blocks (real time, the GIL released) until every announced thread call has answered."""
        # Not by polling the selector meanwhile: a ready descriptor (the self-pipe a signal or an
        # answer writes to) made each poll return at once, so the wait spun holding the GIL the
        # worker needed to answer, and its limit, counted in polls, ran out in well under a second.
        deadline = time.monotonic() + THREAD_ANSWER_WAIT_S
        with self._answer:
            while self._answered < self._announced:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"virtual time: a thread call announced to the loop did not answer in "
                                       f"{THREAD_ANSWER_WAIT_S:g} s ({self._announced} announced, "
                                       f"{self._answered} answered)")
                self._answer.wait(left)
            # an answer nobody announced (a thread of asyncio's own) must not let a later announced
            # call go unwaited
            self._announced = self._answered

    def _deliver(self) -> bool:
        with self._lock:
            held, self._inbox = self._inbox, deque()
        self._ready.extend(held)  # type: ignore[attr-defined]  # asyncio's loop keeps its ready queue private
        return bool(held)

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:  # type: ignore[override]  # typeshed's TypeVarTuple signature
        """Inline: the function blocks the loop for real seconds and no virtual ones."""
        self._check_closed()  # type: ignore[attr-defined]  # BaseEventLoop's private check
        fut: asyncio.Future[T] = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as exc:  # noqa: B036 (as a thread would hand it back)
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise
            fut.set_exception(exc)
        return fut


def run(main: Awaitable[T]) -> T:
    """`asyncio.run` on a virtual-time loop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)  # type: ignore[arg-type]  # a coroutine, as asyncio.run takes


def is_virtual() -> bool:
    """Whether the running loop keeps virtual time."""
    return isinstance(asyncio.get_running_loop(), VirtualTimeLoop)
