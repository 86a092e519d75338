"""The store fails loudly and never silently: a raising listener, a checkpoint that cannot be
written, and a commit that fails while a window runs."""

from __future__ import annotations

import pytest

from events.schema import LogNote
from events.store import EventStore, StoreWriteError


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


async def test_a_commit_that_fails_mid_window_stops_the_runner_for_the_recovery_path(tmp_path):
    from daemon.runner import Runner
    from daemon.target import Target
    from daemon.windows import setup_for_site
    from tests.daemontools import PLAN, Sim

    sim = Sim(tmp_path)
    try:
        setup = setup_for_site(PLAN, sim.site, 100)
        target = Target(setup.site, setup.fixtures, setup.plan_sha256)
        store = await EventStore.open(tmp_path / "log.db")
        real = store._write_rows
        calls = {"n": 0}

        async def failing(rows, bulk):
            calls["n"] += 1
            if calls["n"] == 40:  # mid-preflight, an input with no side effect of its own among them
                raise OSError(28, "No space left on device")
            await real(rows, bulk)

        store._write_rows = failing
        runner = Runner(store, target, "w-disk", 100)
        with pytest.raises(StoreWriteError):
            await runner.run(setup.opened("w-disk"))
        await target.close()
        await store.close()
    finally:
        sim.stop()
