"""Which signals a worker thread takes: none sent from outside; those are the main thread's, whose loop handles them."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# SIGINT, SIGTERM, SIGHUP (an operator, systemd) and every other signal a thread can be sent: a process's
# signal goes to any thread that does not block it, and one taken by a worker interrupts whatever it
# was waiting in (the log's next commit, a file read) for a handler that only the main thread runs.
# The ones a faulting thread raises on itself stay open, or a fault in a worker could not be reported.
OUTSIDE_SIGNALS = (signal.valid_signals() - {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
                                             signal.SIGTRAP, signal.SIGSYS, signal.SIGABRT}
                   if hasattr(signal, "pthread_sigmask") else set())


def block_outside_signals() -> None:
    """Run first in a worker thread (an executor's initializer): it takes no outside signal."""
    if OUTSIDE_SIGNALS:
        signal.pthread_sigmask(signal.SIG_BLOCK, OUTSIDE_SIGNALS)


@contextlib.contextmanager
def threads_started_quiet() -> Iterator[None]:
    """Threads started inside take no outside signal (a new thread takes its starter's mask); this
    thread's own mask is as it was afterwards."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, OUTSIDE_SIGNALS) if OUTSIDE_SIGNALS else None
    try:
        yield
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def quiet_default_executor(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """The running loop's `to_thread` and `run_in_executor(None, ...)` run on threads that take no outside signal."""
    loop = loop or asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix="flare-diag-worker", initializer=block_outside_signals))


def quiet(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` for a worker thread that some other library starts (anyio's): the thread takes no outside
    signal from its first call on."""
    def call(*args: object) -> T:
        block_outside_signals()
        return fn(*args)
    return call
