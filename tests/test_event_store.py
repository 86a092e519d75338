"""The event store: durable, gapless, append-only, group-committed."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from flare_diag.events.chain import GENESIS
from flare_diag.events.checkpoint import default_path, read_checkpoint
from flare_diag.events.reader import LogReader
from flare_diag.events.schema import LogNote
from flare_diag.events.store import UNDURABLE_CHECKPOINT_EVERY, EventStore
from flare_diag.events.verify import verify_log


async def test_append_returns_envelope_with_next_seq_and_chained_hash(tmp_path):
    async with await EventStore.open(tmp_path / "log.db") as store:
        a = await store.append(LogNote(text="a"))
        b = await store.append(LogNote(text="b"))
    assert (a.seq, b.seq) == (1, 2)
    assert a.prev_hash == GENESIS and b.prev_hash == a.hash


async def test_acknowledged_event_is_readable_by_another_connection(tmp_path):
    async with await EventStore.open(tmp_path / "log.db") as store:
        env = await store.append(LogNote(text="durable"))
        conn = sqlite3.connect(tmp_path / "log.db")
        row = conn.execute("SELECT payload FROM events WHERE seq = ?", (env.seq,)).fetchone()
        conn.close()
    assert bytes(row[0]) == env.payload


async def test_concurrent_batches_stay_contiguous_and_in_submission_order(tmp_path):
    async with await EventStore.open(tmp_path / "log.db") as store:
        async def appender(k: int) -> list[int]:
            seqs = []
            for j in range(20):
                envs = await store.append_many([LogNote(text=f"{k}.{j}.{i}", source=str(k)) for i in range(5)])
                seqs.append([e.seq for e in envs])
            return seqs

        results = await asyncio.gather(*(appender(k) for k in range(8)))
        for seqs in results:
            for batch in seqs:
                assert batch == list(range(batch[0], batch[0] + 5))
            firsts = [b[0] for b in seqs]
            assert firsts == sorted(firsts)
        all_seqs = sorted(s for seqs in results for b in seqs for s in b)
    assert all_seqs == list(range(1, 8 * 20 * 5 + 1))


async def test_many_submissions_share_one_commit(tmp_path):
    async with await EventStore.open(tmp_path / "log.db") as store:
        futs = [store.submit(LogNote(text=str(i))) for i in range(500)]
        await asyncio.gather(*futs)
        conn = sqlite3.connect(tmp_path / "log.db")
        # every event of one group commit was written in the same transaction: one WAL frame set;
        # the observable consequence is that all 500 are present once the first future resolves
        assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 500
        conn.close()


async def test_envelopes_acknowledged_from_shared_commits_are_the_rows_the_log_holds(tmp_path):
    seen = []
    async with await EventStore.open(tmp_path / "log.db") as store:
        store.subscribe(seen.extend)

        async def appender(k: int) -> list:
            envs = []
            for j in range(30):  # singles and runs interleaved, so most commits hold several submissions
                if j % 3:
                    envs.append(await store.append(LogNote(text=f"{k}.{j}"), window_id=f"w{k}"))
                else:
                    envs.extend(await store.append_many([LogNote(text=f"{k}.{j}.{i}") for i in range(4)],
                                                        window_id=f"w{k}", causation_seq=j))
            return envs

        acked = [e for envs in await asyncio.gather(*(appender(k) for k in range(6))) for e in envs]
    with LogReader(tmp_path / "log.db") as r:
        stored = {e.seq: e for e in r.iter()}
    assert sorted(e.seq for e in acked) == list(stored)
    assert all(e == stored[e.seq] for e in acked)
    assert seen == [stored[s] for s in sorted(stored)]


async def test_reopened_store_continues_the_chain(tmp_path):
    path = tmp_path / "log.db"
    async with await EventStore.open(path) as store:
        first = await store.append(LogNote(text="1"))
    async with await EventStore.open(path) as store:
        second = await store.append(LogNote(text="2"))
    assert second.seq == 2 and second.prev_hash == first.hash
    with LogReader(path) as r:
        assert verify_log(r).ok


async def test_update_and_delete_are_refused_by_triggers(tmp_path):
    path = tmp_path / "log.db"
    async with await EventStore.open(path) as store:
        await store.append(LogNote(text="x"))
    conn = sqlite3.connect(path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE events SET payload = x'00' WHERE seq = 1")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM events WHERE seq = 1")
    conn.close()


async def test_a_closed_durable_logs_checkpoint_is_its_head(tmp_path):
    path = tmp_path / "log.db"
    async with await EventStore.open(path) as store:
        env = await store.append(LogNote(text="x"))
    cp = read_checkpoint(default_path(path))  # its slot is written after the append returns, before close ends
    assert cp is not None and cp.seq == env.seq and cp.hash == env.hash.hex()


async def test_a_durable_logs_checkpoint_follows_each_commit_and_is_its_head_before_the_next(tmp_path):
    """The checkpoint slot is written on the database thread just after a commit is answered: an append
    may return a moment before it, never after the next commit has started."""
    path = tmp_path / "log.db"
    async with await EventStore.open(path) as store:
        prev = None
        for i in range(2 * UNDURABLE_CHECKPOINT_EVERY + 3):
            env = await store.append(LogNote(text=f"{i}"))
            cp = read_checkpoint(default_path(path))
            assert (None if cp is None else (cp.seq, cp.hash)) in {(env.seq, env.hash.hex()), prev}
            after = await store.append(LogNote(text="after"))
            cp = read_checkpoint(default_path(path))
            assert cp is not None and cp.seq >= env.seq  # the next commit came after env's slot
            prev = (after.seq, after.hash.hex())


async def test_an_undurable_logs_checkpoint_lags_by_fewer_commits_than_its_cadence_and_is_the_head_once_closed(tmp_path):
    path = tmp_path / "log.db"
    store = await EventStore.open(path, durable=False)
    seen = set()
    try:
        for i in range(2 * UNDURABLE_CHECKPOINT_EVERY + 3):
            env = await store.append(LogNote(text=f"{i}"))  # a commit each
            cp = read_checkpoint(default_path(path))
            lag = env.seq - (cp.seq if cp is not None else 0)
            # a due commit's slot is written just after its append returns, before the next commit
            assert 0 <= lag <= UNDURABLE_CHECKPOINT_EVERY
            if cp is not None:
                seen.add(cp.seq)
    finally:
        await store.close()
    assert len(seen) >= 2  # it caught up at its cadence twice, and lagged between
    cp = read_checkpoint(default_path(path))
    with LogReader(path) as r:
        assert verify_log(r, cp).ok and cp.seq == env.seq and cp.hash == env.hash.hex()


async def test_an_event_submitted_by_the_task_a_submission_woke_shares_its_commit(tmp_path):
    """An observation, and the decision the runner makes on it once the observation wakes it: one
    transaction, not two (in virtual time each is a round trip to the writer thread)."""
    async with await EventStore.open(tmp_path / "log.db") as store:
        inbox: asyncio.Queue = asyncio.Queue()

        async def runner() -> asyncio.Future:
            await inbox.get()
            return store.submit(LogNote(text="the decision"))

        decide = asyncio.create_task(runner())
        await asyncio.sleep(0)  # the runner waits for its input
        observed = store.submit(LogNote(text="the observation"))
        inbox.put_nowait(observed)
        decided = await decide
        assert decided is observed  # one commit group's future
        receipt = await decided
    assert [e.seq for e in receipt.envelopes()] == [1, 2]


async def test_iteration_by_window_and_by_type(tmp_path):
    async with await EventStore.open(tmp_path / "log.db") as store:
        await store.append(LogNote(text="a"), window_id="w1")
        await store.append(LogNote(text="b"), window_id="w2")
        await store.append(LogNote(text="c"), window_id="w1")
        w1 = [e.event().text async for e in store.iter(window_id="w1")]
        notes = [e.seq async for e in store.iter(types=["log_note"], from_seq=2)]
    assert w1 == ["a", "c"]
    assert notes == [2, 3]


async def test_append_after_close_is_refused(tmp_path):
    store = await EventStore.open(tmp_path / "log.db")
    await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.submit(LogNote(text="late"))


async def test_opening_a_non_log_file_is_refused(tmp_path):
    bad = tmp_path / "other.db"
    conn = sqlite3.connect(bad)
    conn.execute("CREATE TABLE meta (key TEXT, value TEXT)")
    conn.execute("INSERT INTO meta VALUES ('format', 'something-else')")
    conn.commit()
    conn.close()
    with pytest.raises(ValueError, match="not a flare-diag event log"):
        await EventStore.open(bad)


async def test_stored_hash_matches_the_reference_chain_function(tmp_path):
    from flare_diag.events.chain import event_hash
    async with await EventStore.open(tmp_path / "log.db") as store:
        a = await store.append(LogNote(text="ref"), window_id="w", causation_seq=None)
    assert a.hash == event_hash(GENESIS, a.seq, a.type, a.schema_v, a.mono_ns, a.wall_ns, a.window_id, None, a.payload)


async def test_failed_commit_rejects_every_submission_of_its_group(tmp_path):
    from flare_diag.events.store import StoreWriteError

    async with await EventStore.open(tmp_path / "log.db") as store:
        await store.append(LogNote(text="kept"))
        # another writer takes seq 2 behind the store's back, so the store's next commit collides
        conn = sqlite3.connect(tmp_path / "log.db", isolation_level=None)
        conn.execute("INSERT INTO events VALUES (2, 0, 0, 'log_note', 1, '', NULL, x'7b7d', zeroblob(32), zeroblob(32))")
        conn.close()
        futs = [store.submit(LogNote(text=t)) for t in ("x", "y", "z")]
        results = await asyncio.gather(*futs, return_exceptions=True)
        assert store.head[0] == 1
    assert all(isinstance(r, StoreWriteError) for r in results)
    conn = sqlite3.connect(tmp_path / "log.db")
    texts = [bytes(p) for (p,) in conn.execute("SELECT payload FROM events ORDER BY seq")]
    conn.close()
    assert not any(b'"x"' in t or b'"y"' in t or b'"z"' in t for t in texts)


async def test_large_payloads_are_stored_byte_exact(tmp_path):
    big = "é" * 300_000 + "\x00\n\"\\"
    async with await EventStore.open(tmp_path / "log.db") as store:
        envs = await store.append_many([LogNote(text=big), LogNote(text="small")])
    with LogReader(tmp_path / "log.db") as r:
        stored = list(r.iter())
        assert verify_log(r).ok
    assert [e.payload for e in stored] == [e.payload for e in envs]
    assert stored[0].event().text == big


async def test_events_caused_by_the_first_of_a_submission_carry_its_seq(tmp_path):
    async with await EventStore.open(tmp_path / "log.db") as store:
        await store.append(LogNote(text="before"))
        envs = await store.append_many([LogNote(text="input"), LogNote(text="d1"), LogNote(text="d2")])
        fut = store.submit_many([LogNote(text="input2"), LogNote(text="d3")], caused_by_first=True)
        await fut
    with LogReader(tmp_path / "log.db") as r:
        rows = [(e.seq, e.causation_seq) for e in r.iter()]
        assert verify_log(r).ok
    assert [e.causation_seq for e in envs] == [None, None, None]
    assert rows[-2:] == [(5, None), (6, 5)]


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task"), reason="reads the thread's mask from /proc")
async def test_the_stores_worker_thread_leaves_interrupts_to_the_main_thread_and_still_reports_faults(tmp_path):
    import os
    import signal
    import threading

    from tests.daemontools import blocked_signals
    before = blocked_signals(os.getpid(), threading.main_thread().native_id)
    async with await EventStore.open(tmp_path / "log.db") as store:
        await store.append(LogNote(text="a"))
        worker = blocked_signals(os.getpid(), store._db.thread.native_id)
        assert {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD} <= worker
        assert not {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT} & worker
        # the main thread's own mask is as it was: it still takes every signal it took
        assert blocked_signals(os.getpid(), threading.main_thread().native_id) == before


def test_a_row_whose_payload_is_another_types_event_does_not_decode_as_either():
    """The union decodes a payload by its own tag; a row's type column must be that tag (a damaged or
    forged row names one type and carries another)."""
    from flare_diag.events.base import BadEventError, decode_payload, encode_payload
    from flare_diag.events.schema import WindowClosed
    payload = encode_payload(LogNote(text="x"))
    with pytest.raises(BadEventError, match="'window_closed' row whose stored bytes are a 'log_note' event"):
        decode_payload("window_closed", WindowClosed.schema_v, payload)


def test_a_batch_is_inserted_without_a_temporary_sort_of_its_rows():
    # every row names its own seq, so insertion order changes nothing stored; a sorter would copy the
    # whole batch, payloads and all, before a single row is written
    from flare_diag.events.sqlschema import BULK_INSERT, DDL
    from flare_diag.events.store import split_ddl
    conn = sqlite3.connect(":memory:")
    for stmt in split_ddl(DDL):
        conn.execute(stmt)
    plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + BULK_INSERT, ("[]", b"", b"")))
    assert "TEMP B-TREE" not in plan, plan

