"""The event store's one database thread: its own sqlite3 connection, calls run in the order they were
made, each answered on the loop the moment its work is done, with follow-up work after the answer."""

from __future__ import annotations

import asyncio
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from flare_diag.events.signals import threads_started_quiet

T = TypeVar("T")
Answer = Callable[[Any, BaseException | None], None]


class DbThreadClosed(RuntimeError):
    """A call was made after the thread was closed."""


class DbThread:
    """Why not aiosqlite's thread: a commit is acknowledged as soon as COMMIT returns, before the work that
    only follows it (the checkpoint slot, a WAL checkpoint) runs on the same thread; and the answer is a
    plain callback on the loop, not a future that wakes a task that wakes the appender (docs/event-log.md).

    A loop that keeps virtual time (daemon/rehearsal/virtualtime.py) is told of each call before it is
    handed over, and holds its clock until the call has answered."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._jobs: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._announce = getattr(loop, "thread_call_started", None)
        with threads_started_quiet():  # the thread takes no outside signal (events/signals.py)
            self.thread = threading.Thread(target=self._run, name="event-store-db", daemon=True)
            self.thread.start()

    @classmethod
    async def open(cls, path: str | os.PathLike[str]) -> DbThread:
        db = cls(asyncio.get_running_loop())
        try:
            await db.call(db._connect, os.fspath(path))
        except BaseException:
            await db.close()
            raise
        return db

    def submit(self, fn: Callable[..., Any], *args: Any, answer: Answer,
               then: Callable[[sqlite3.Connection], None] | None = None) -> None:
        """Runs `fn(conn, *args)` on the thread; `answer(result, error)` is called on the loop; `then(conn)`
        runs on the thread after the answer is sent (before it, under virtual time), before the next call."""
        if self._closed:
            raise DbThreadClosed("the event store's database thread is closed")
        if self._announce is not None:
            self._announce()
        self._jobs.put((fn, args, answer, then))

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` on the thread, awaited."""
        fut: asyncio.Future[T] = self._loop.create_future()

        def answer(result: Any, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)
        self.submit(fn, *args, answer=answer)
        return await fut

    async def close(self) -> None:
        """Closes the connection on its thread and ends the thread (after every call made before)."""
        if self._closed:
            return
        try:
            await self.call(_close)
        finally:
            self._closed = True
            self._jobs.put(None)
            await asyncio.get_running_loop().run_in_executor(None, self.thread.join)

    def _connect(self, _conn: object, path: str) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, answer, then = job
            try:
                result, error = fn(self._conn, *args), None
            except BaseException as exc:  # noqa: B036 (handed back to the caller, as a thread's answer)
                result, error = None, exc
            follow = then if then is not None and error is None and self._conn is not None else None
            if follow is not None and self._announce is not None:
                follow(self._conn)  # virtual time: the loop holds its clock until the answer, so nothing may follow it
                follow = None
            try:
                self._loop.call_soon_threadsafe(answer, result, error)
            except RuntimeError:  # the loop is closed: nobody is waiting
                pass
            if follow is not None:
                follow(self._conn)


def _close(conn: sqlite3.Connection | None) -> None:
    if conn is not None:
        conn.close()
