"""Where a durable append's time goes, beside the `eventsourcing` recorder's: the parts behind bench/event_log.py's ratio.

1. One awaited append through EventStore (one ~5.4 KB `request_done`-sized event, and bulk, 100 a commit),
   timed at its seams: encoding and queueing, the SHA-256 chain, the hop to the database thread, the
   INSERT, the COMMIT (one fdatasync), the answer's hop back to the loop, the appender's wake-up.
2. The store's own work with no thread at all: each append encoded, chained (the store's `_hash_rows`) and
   written (`BULK_INSERT`, COMMIT) on the calling thread, as the recorder does its own, against the recorder's
   whole append, alternated: what any design that keeps the chain, hops or none, would take.
3. The SQL alone, on one thread, the same rows: the store's table (its two lookup indexes, with and
   without them) against eventsourcing's SQLite table (`stored_events`' shape: one primary key), each
   `BEGIN IMMEDIATE; INSERT ...; COMMIT` with WAL and synchronous=FULL; the three alternated.

Usage: python bench/event_log_parts.py [--commits 1000] [--bulk-commits 150] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flare_diag.events import store as store_module  # noqa: E402
from flare_diag.events.base import encode_payload  # noqa: E402
from flare_diag.events.sqlschema import DDL, INSERT  # noqa: E402
from flare_diag.events.store import EventStore, _Group, split_ddl  # noqa: E402

from event_log import _peer_single, _request_done_sized  # noqa: E402  (the same event and peer as the ratio's)

SEAMS = ("submit", "chain", "hop_in", "insert", "commit", "hop_back", "wake")
_at: dict[str, int] = {}


def _timed_seams() -> None:
    """Stamps each seam of the store's commit path as it passes (the bench's process only)."""
    def transaction(_self, conn, chained):
        _at["hop_in"] = time.perf_counter_ns()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(store_module.BULK_INSERT, chained.bulk())
        _at["insert"] = time.perf_counter_ns()
        conn.execute("COMMIT")
        _at["commit"] = time.perf_counter_ns()
    committed, hash_rows = EventStore._committed, EventStore._hash_rows

    def on_answer(self, *a):
        _at["hop_back"] = time.perf_counter_ns()
        return committed(self, *a)

    def chaining(self, *a):
        _at["submit"] = time.perf_counter_ns()
        out = hash_rows(self, *a)
        _at["chain"] = time.perf_counter_ns()
        return out
    EventStore._run_transaction, EventStore._committed, EventStore._hash_rows = transaction, on_answer, chaining


async def _store_parts(path: Path, commits: int, bulk: int) -> dict[str, float]:
    """Median microseconds of each seam, and of the whole append."""
    store = await EventStore.open(path)
    evs = [_request_done_sized(i) for i in range(bulk)]
    rows = []
    for _ in range(commits):
        t0 = time.perf_counter_ns()
        await store.append_many(evs, window_id="bench")
        t1 = time.perf_counter_ns()
        marks = [t0] + [_at[s] for s in SEAMS[:-1]] + [t1]
        rows.append([b - a for a, b in zip(marks, marks[1:])] + [t1 - t0])
    await store.close()
    return {name: statistics.median(r[k] for r in rows) / 1e3 for k, name in enumerate((*SEAMS, "total"))}


def _peer_total(path: Path, commits: int, bulk: int) -> float:
    """Median microseconds of the recorder's whole append (bench/event_log.py's peer, on this thread)."""
    return statistics.median(_peer_single(path, commits, bulk)) * 1e6


PEER_TABLE = ("CREATE TABLE stored_events (originator_id TEXT, originator_version INTEGER, topic TEXT, state BLOB, "
              "PRIMARY KEY (originator_id, originator_version))")
PEER_INSERT = "INSERT INTO stored_events VALUES (?,?,?,?)"


def _sql_alone(path: Path, ddl: list[str], peer: bool, commits: int, bulk: int) -> tuple[float, float]:
    """Median microseconds of the INSERT and of the COMMIT, the same rows a commit, on this thread."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    for stmt in ddl:
        conn.execute(stmt)
    payload = encode_payload(_request_done_sized(0))
    ins, com = [], []
    for k in range(commits):
        base = 1 + k * bulk
        t0 = time.perf_counter_ns()
        conn.execute("BEGIN IMMEDIATE")
        if peer:
            conn.executemany(PEER_INSERT, [("bench", base + i, "log_note", payload) for i in range(bulk)])
        else:
            conn.executemany(INSERT, [(base + i, 1, 2, "log_note", 1, "bench", None, payload, bytes(32), bytes(32))
                                      for i in range(bulk)])
        t1 = time.perf_counter_ns()
        conn.execute("COMMIT")
        ins.append(t1 - t0)
        com.append(time.perf_counter_ns() - t1)
    conn.close()
    return statistics.median(ins) / 1e3, statistics.median(com) / 1e3


def _inline(path: Path, commits: int, bulk: int) -> list[float]:
    """Seconds of each append with the store's encoding, chain and SQL on this thread, no hop."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    for stmt in split_ddl(DDL):
        conn.execute(stmt)
    store = EventStore.__new__(EventStore)  # only its chain: `_hash_rows` reads these two fields
    store._prefixes, store._tent_seq = {}, 0
    event, seq, prev, times = _request_done_sized(0), 0, bytes(32), []
    for _ in range(commits):
        t0 = time.perf_counter()
        group = _Group.__new__(_Group)
        group.rows = [("request_done", 1, "bench", None, encode_payload(event), 1, 2) for _ in range(bulk)]
        chained = store._hash_rows([group], seq, prev)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(store_module.BULK_INSERT, chained.bulk())
        conn.execute("COMMIT")
        seq, prev = chained.head
        times.append(time.perf_counter() - t0)
    conn.close()
    return times


def _print_inline(d: Path, commits: int, bulk_commits: int, rounds: int) -> None:
    for bulk, n in ((1, commits), (100, bulk_commits)):
        ours, peer = [], []
        for r in range(rounds):  # alternated, as the SQL-alone part
            ours.append(statistics.median(_inline(d / f"inline{bulk}-{r}.db", n, bulk)) * 1e6)
            peer.append(_peer_total(d / f"inline-peer{bulk}-{r}.db", n, bulk))
        what = "single" if bulk == 1 else f"bulk {bulk}"
        print(f"inline {what:>8} (encode, chain and SQL on this thread, median us; {rounds} rounds): "
              f"{statistics.median(ours):,.0f}  eventsourcing {statistics.median(peer):,.0f}  ratio = "
              f"{statistics.median(ours) / statistics.median(peer):.2f}")


def _print_store_parts(d: Path, commits: int, bulk_commits: int) -> None:
    for bulk, n in ((1, commits), (100, bulk_commits)):
        parts = asyncio.run(_store_parts(d / f"parts{bulk}.db", n, bulk))
        peer = _peer_total(d / f"peer{bulk}.db", n, bulk)
        what = "single" if bulk == 1 else f"bulk {bulk}"
        print(f"append {what:>8} (median us of {n:,} awaited commits): " + ", ".join(f"{s} {parts[s]:,.0f}" for s in SEAMS)
              + f"; total {parts['total']:,.0f}  eventsourcing total {peer:,.0f}  ratio store/eventsourcing = "
              f"{parts['total'] / peer:.2f}")
        beyond = parts["submit"] + parts["chain"] + parts["hop_in"] + parts["hop_back"] + parts["wake"]
        print(f"append {what:>8}   the store's SQL (insert + commit) {parts['insert'] + parts['commit']:,.0f} us; the rest "
              f"(encoding, chain, the two hops, wake-up) {beyond:,.0f} us")


def _print_sql(d: Path, commits: int, rounds: int) -> None:
    full = split_ddl(DDL)
    lean = [s for s in full if "CREATE INDEX" not in s]
    sides = {"store table": (full, False), "store table without its lookup indexes": (lean, False),
             "eventsourcing table": ([PEER_TABLE], True)}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    for r in range(rounds):  # alternated: a neighbour's burst of I/O falls on all three
        for k, (ddl, peer) in sides.items():
            got[k].append(_sql_alone(d / f"sql{r}-{len(got[k])}-{peer}-{len(ddl)}.db", ddl, peer, commits, 100))
    med = {k: (statistics.median(i for i, _ in v), statistics.median(c for _, c in v)) for k, v in got.items()}
    peer = sum(med["eventsourcing table"])
    for k, (i, c) in med.items():
        print(f"sql bulk 100 ({k}): insert {i:,.0f} us + commit {c:,.0f} us = {i + c:,.0f} us  "
              f"ratio to the eventsourcing table = {(i + c) / peer:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=1000, help="awaited single appends (and their peer's)")
    ap.add_argument("--bulk-commits", type=int, default=150, help="awaited bulk appends of 100 (and their peer's)")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of the SQL-alone part, alternated")
    ap.add_argument("--dir", type=Path, default=None, help="folder on the file system to measure (default: a temp dir)")
    a = ap.parse_args()
    _timed_seams()
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        _print_store_parts(Path(d), a.commits, a.bulk_commits)
        _print_inline(Path(d), a.commits, a.bulk_commits, max(1, a.rounds // 2))
        _print_sql(Path(d), a.bulk_commits // 2 or 1, a.rounds)


if __name__ == "__main__":
    main()
