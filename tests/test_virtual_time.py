"""The virtual-time loop: the clock jumps over idle waits, and never while work is out on a thread."""

from __future__ import annotations

import asyncio
import time

import pytest

from flare_diag.daemon.rehearsal import virtualtime
from flare_diag.events.schema import LogNote
from flare_diag.events.checkpoint import read_checkpoint
from flare_diag.events.dbthread import DbThread, DbThreadClosed
from flare_diag.events.store import EventStore


def test_an_hour_of_sleep_takes_no_real_time():
    async def main() -> float:
        await asyncio.sleep(3600)
        return asyncio.get_running_loop().time()

    t0 = time.monotonic()
    assert virtualtime.run(main()) == pytest.approx(3600)
    assert time.monotonic() - t0 < 5


def test_timers_fire_in_virtual_order_whatever_their_real_cost():
    order: list[str] = []

    async def sleeper(name: str, s: float, busy_s: float) -> None:
        await asyncio.sleep(s)
        end = time.monotonic() + busy_s  # real CPU spent: must not move the virtual clock
        while time.monotonic() < end:
            pass
        order.append(f"{name}@{asyncio.get_running_loop().time():g}")

    async def main() -> None:
        await asyncio.gather(sleeper("slow", 2, 0.2), sleeper("fast", 1, 0.0), sleeper("last", 3, 0.0))

    virtualtime.run(main())
    assert order == ["fast@1", "slow@2", "last@3"]


def test_the_clock_waits_for_a_commit_on_the_stores_database_thread(tmp_path):
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        store = await EventStore.open(tmp_path / "log.db")
        try:
            ticker = asyncio.ensure_future(asyncio.sleep(1))  # a timer the clock could jump to
            t0 = loop.time()
            for i in range(20):
                await store.append(LogNote(text=f"n{i}"))
            after = loop.time()
            await ticker
            return t0, after
        finally:
            await store.close()

    t0, after = virtualtime.run(main())
    assert after == t0  # twenty durable commits took no virtual time


def test_a_thread_call_refused_before_its_hand_over_is_never_waited_for(tmp_path):
    async def main() -> float:
        db = await DbThread.open(tmp_path / "x.db")
        await db.close()
        with pytest.raises(DbThreadClosed):
            await db.call(lambda conn: conn.execute("SELECT 1"))  # closed: refused before reaching the thread
        await asyncio.sleep(10)
        return asyncio.get_running_loop().time()

    t0 = time.monotonic()
    assert virtualtime.run(main()) >= 10
    assert time.monotonic() - t0 < virtualtime.THREAD_ANSWER_WAIT_S


def test_in_virtual_time_a_durable_commits_checkpoint_is_written_before_its_append_returns(tmp_path, monkeypatch):
    """On the wall clock the checkpoint slot follows the answer; in virtual time nothing may follow it
    (the clock could move while the thread still works), so each append finds the checkpoint at its head
    however slow the slot's write."""
    from flare_diag.events.checkpoint import CheckpointSlots
    write = CheckpointSlots.write

    def slow_write(self, *args, **kw):
        time.sleep(0.05)
        write(self, *args, **kw)
    monkeypatch.setattr(CheckpointSlots, "write", slow_write)

    async def main() -> list[bool]:
        store = await EventStore.open(tmp_path / "log.db")
        try:
            seen = []
            for i in range(10):
                env = await store.append(LogNote(text=f"n{i}"))
                cp = read_checkpoint(store.checkpoint_path)
                seen.append(cp is not None and cp.seq == env.seq)
            return seen
        finally:
            await store.close()

    assert virtualtime.run(main()) == [True] * 10


def test_to_thread_runs_inline_in_virtual_time():
    async def main() -> tuple[float, str]:
        import threading
        name = await asyncio.to_thread(lambda: threading.current_thread().name)
        return asyncio.get_running_loop().time(), name

    now, name = virtualtime.run(main())
    assert now == 0 and name == "MainThread"


def test_a_ready_descriptor_does_not_cut_short_the_wait_for_a_slow_thread():
    """The loop waits out a thread that takes 1.5 s to answer, in real time, even while its self-pipe
    is readable throughout (a signal or an answer wrote to it): the wait neither spins nor gives up."""
    import threading

    async def main() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def slow() -> None:
            time.sleep(1.5)
            loop.call_soon_threadsafe(fut.set_result, "answered")

        loop.thread_call_started()
        threading.Thread(target=slow, daemon=True).start()
        loop._write_to_self()  # readable until the loop reads it, which it does only once idle
        return await fut, loop.time()

    t0 = time.monotonic()
    assert virtualtime.run(main()) == ("answered", 0.0)
    assert time.monotonic() - t0 >= 1.5
