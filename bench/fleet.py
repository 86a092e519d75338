"""The fleet on a real PostgreSQL server, side by side in one run.

1. Ingest: the shipper (chain checks, COPY, window rows, head update with the database's own chain
   check) against a raw COPY of the same rows into a bare copy of the events table. Goal >= 0.8x.
2. Many hosts shipping at once: N hosts each shipping E events concurrently, one connection each; the
   lag of every batch (from the host's commit of its last event to the batch's commit centrally). Goal
   p99 < 1 s.
3. The views at scale: `fleet status` and `fleet windows` over H hosts and W windows. Goal < 100 ms.
4. Leases: A concurrent attempts on a pool with K = 3: never more than 3 granted, with the p99 time.

    python bench/fleet.py                      # full size: 1,000 hosts x 2,000 events, 100,000 windows
    python bench/fleet.py --hosts 20 --events 200 --windows 2000 --ingest 5000   # the suite's small size
"""

from __future__ import annotations

import argparse
import hashlib
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flare_diag.daemon.fleet import lease, views  # noqa: E402
from flare_diag.daemon.fleet.db import migrate  # noqa: E402
from flare_diag.daemon.fleet.shipper import ship_once  # noqa: E402
from flare_diag.events.chain import GENESIS, event_hash  # noqa: E402
from flare_diag.events.sqlschema import DDL  # noqa: E402
from tests.pgtools import PgServer  # noqa: E402

PAYLOAD = b'{"type":"request_done","at_ns":%d,"action_id":%d,"phase":"A.forward_replay","order_index":%d,' \
          b'"outcome":"ok","prompt_tokens":9000,"completion_tokens":700,"response_sha256":"%s"}'


def make_log(path: Path, n: int, wall0: int) -> None:
    """A host's SQLite log of `n` chained events in one window (opened, requests, closed)."""
    conn = sqlite3.connect(path)
    conn.executescript(DDL)
    prev, rows = GENESIS, []
    wid = f"w-{path.stem}"
    for seq in range(1, n + 1):
        if seq == 1:
            type_, payload = "log_note", b'{"type":"log_note","text":"bench","source":""}'
        else:
            type_, payload = "request_done", PAYLOAD % (seq, seq, seq, hashlib.sha256(b"%d" % seq).hexdigest().encode())
        wall = wall0 + seq * 1000
        h = event_hash(prev, seq, type_, 1, seq, wall, wid, None, payload)
        rows.append((seq, seq, wall, type_, 1, wid, None, payload, prev, h))
        prev = h
    conn.executemany("INSERT INTO events (seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload, "
                     "prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()


async def ingest(dsn: str, tmp: Path, n: int, rounds: int = 3) -> tuple[float, float]:
    """(best shipper seconds, best raw COPY seconds) for the same n rows, alternated."""
    log = tmp / "ingest.db"
    make_log(log, n, time.time_ns())
    conn_l = sqlite3.connect(log)
    rows = conn_l.execute("SELECT seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload, prev_hash, "
                          "hash FROM events ORDER BY seq").fetchall()
    conn_l.close()
    ship_t, raw_t = [], []
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute("CREATE TABLE raw_events (LIKE events INCLUDING ALL)")
        await conn.commit()
        for r in range(rounds):
            host = f"ingest-{r}"
            t0 = time.perf_counter()
            while (await ship_once(conn, host, "bench", log, batch=n)).events:
                pass
            ship_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            async with conn.transaction():
                async with conn.cursor().copy("COPY raw_events (host, seq, mono_ns, wall_ns, type, schema_v, window_id, "
                                              "causation_seq, payload, prev_hash, hash) FROM STDIN") as copy:
                    for row in rows:
                        await copy.write_row((host, *row))
            raw_t.append(time.perf_counter() - t0)
    return min(ship_t), min(raw_t)


async def many_hosts(dsn: str, tmp: Path, hosts: int, events: int, batch: int) -> list[float]:
    """Every host's log written first (as committed before shipping starts); then all ship at once.
    The lag of a batch: from the moment shipping began (every event was committed locally by then) to
    that batch's commit centrally, so it includes waiting for a connection and the database's queue."""
    wall0 = time.time_ns()
    logs = []
    for h in range(hosts):
        p = tmp / f"host-{h:04d}.db"
        make_log(p, events, wall0)
        logs.append(p)
    lags: list[float] = []
    limit = anyio.CapacityLimiter(90)  # the server's connections: 300, shared with nothing else here
    start = time.perf_counter()

    async def ship(h: int, path: Path) -> None:
        async with limit:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                while (await ship_once(conn, f"host-{h:04d}", "fleet-bench", path, batch)).events:
                    lags.append(time.perf_counter() - start)

    async with anyio.create_task_group() as tg:
        for h, p in enumerate(logs):
            tg.start_soon(ship, h, p)
    return lags


async def steady(dsn: str, tmp: Path, hosts: int, events: int, seconds: float, connections: int = 60) -> list[float]:
    """Steady state: every host commits its events in bursts spread over `seconds` while its shipper
    ships; `connections` shared as a pooler would share them. The lag of a batch: from the local commit
    of its oldest event to the batch's commit centrally."""
    import random
    import sqlite3 as sq

    burst = 100
    bursts = max(1, events // burst)
    committed: dict[str, dict[int, float]] = {}
    paths = []
    for h in range(hosts):
        p = tmp / f"steady-{h:04d}.db"
        c = sq.connect(p)
        c.executescript(DDL)
        c.close()
        paths.append(p)
        committed[p.stem] = {}
    send, recv = anyio.create_memory_object_stream[psycopg.AsyncConnection](connections)
    conns = [await psycopg.AsyncConnection.connect(dsn) for _ in range(connections)]
    for c in conns:
        send.send_nowait(c)
    lags: list[float] = []
    rng = random.Random(7)

    def write_burst(path: Path, first: int, prev: bytes) -> bytes:
        c = sq.connect(path)
        rows = []
        for seq in range(first, first + burst):
            payload = PAYLOAD % (seq, seq, seq, hashlib.sha256(b"%d" % seq).hexdigest().encode())
            wall = time.time_ns()
            h = event_hash(prev, seq, "request_done", 1, seq, wall, path.stem, None, payload)
            rows.append((seq, seq, wall, "request_done", 1, path.stem, None, payload, prev, h))
            prev = h
        c.executemany("INSERT INTO events (seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload, "
                      "prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        c.commit()
        c.close()
        return prev

    async def writer(path: Path) -> None:
        prev, seq = GENESIS, 1
        await anyio.sleep(rng.random() * seconds / bursts)
        for _ in range(bursts):
            prev = await anyio.to_thread.run_sync(write_burst, path, seq, prev)
            now = time.perf_counter()
            for s in range(seq, seq + burst):
                committed[path.stem][s] = now
            seq += burst
            await anyio.sleep(seconds / bursts)

    async def shipper(path: Path) -> None:
        head = 0
        while head < bursts * burst:
            conn = await recv.receive()
            try:
                res = await ship_once(conn, path.stem, "steady", path, 2000)
            finally:
                send.send_nowait(conn)
            if res.events:
                oldest = res.head_seq - res.events + 1
                lags.append(time.perf_counter() - committed[path.stem][oldest])
                head = res.head_seq
            else:
                await anyio.sleep(0.2)

    async with anyio.create_task_group() as tg:
        for p in paths:
            tg.start_soon(writer, p)
            tg.start_soon(shipper, p)
    for c in conns:
        await c.close()
    return lags


async def seed_windows(dsn: str, hosts: int, windows: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction():
            async with conn.cursor().copy("COPY windows (host, window_id, pool, plan, opened_at, closed_at, outcome, verdict, "
                                          "restoration_verified, last_seq) FROM STDIN") as copy:
                for i in range(windows):
                    h = i % hosts
                    await copy.write_row((f"host-{h:04d}", f"bench-{i:07d}", "fleet-bench", "2026-10-22-cache-diagnosis",
                                          f"2026-11-{1 + i % 28:02d} {i % 24:02d}:00:00+00", None if i % 97 == 0 else
                                          f"2026-11-{1 + i % 28:02d} {i % 24:02d}:30:00+00", "completed",
                                          "row_checkpoint_churn" if i % 3 else "not_reproduced", True, i))
        await conn.execute("ANALYZE windows")
        await conn.commit()


async def timed(fn, *args, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        await fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best


async def leases(dsn: str, attempts: int) -> tuple[int, list[float]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await c.execute("INSERT INTO pools (pool, max_down) VALUES ('lease-bench', 3)")
    granted, times = [], []
    limit = anyio.CapacityLimiter(200)

    async def attempt(i: int) -> None:
        async with limit:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                t0 = time.perf_counter()
                try:
                    await lease.take(conn, "lease-bench", f"lease-host-{i}", f"w{i}", "bench")
                    granted.append(i)
                except lease.PoolFull:
                    pass
                times.append(time.perf_counter() - t0)

    async with anyio.create_task_group() as tg:
        for i in range(attempts):
            tg.start_soon(attempt, i)
    return len(granted), times


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] if len(xs) >= 2 else (xs[0] if xs else 0.0)


async def main_async(a: argparse.Namespace, dsn: str, tmp: Path) -> int:
    await migrate(dsn)
    ship_s, raw_s = await ingest(dsn, tmp, a.ingest)
    ratio = raw_s / ship_s
    print(f"ingest of {a.ingest} events: shipper {ship_s * 1000:.0f} ms, raw COPY {raw_s * 1000:.0f} ms "
          f"(ratio {ratio:.2f}x of raw; goal >= 0.8)")
    lags = await many_hosts(dsn, tmp, a.hosts, a.events, a.batch)
    print(f"{a.hosts} hosts x {a.events} events, all committed before shipping starts, shipped concurrently (the "
          f"backlog's drain, the worst case): {len(lags)} batches, lag p50 "
          f"{statistics.median(lags):.3f} s, p99 {p99(lags):.3f} s, max {max(lags):.3f} s (goal p99 < 1 s)")
    if a.steady:
        lags = await steady(dsn, tmp, a.hosts, a.events, a.steady)
        print(f"{a.hosts} hosts x {a.events} events committed over {a.steady:g} s while shipping (steady state, "
              f"{a.events * a.hosts / a.steady:,.0f} events a second in all): {len(lags)} batches, lag p50 "
              f"{statistics.median(lags):.3f} s, p99 {p99(lags):.3f} s, max {max(lags):.3f} s (goal p99 < 1 s)")
    await seed_windows(dsn, a.hosts, a.windows)
    st = await timed(views.status, dsn)
    wl = await timed(views.windows, dsn, None, None, "not_reproduced", None)
    wh = await timed(views.windows, dsn, "host-0001", None, None, None)
    print(f"views over {a.hosts} hosts and {a.windows} windows: fleet status {st * 1000:.1f} ms, fleet windows "
          f"--verdict {wl * 1000:.1f} ms, --host {wh * 1000:.1f} ms (goal < 100 ms; indexes: windows_opened, "
          f"windows_verdict, windows_running, the windows primary key, leases_pool)")
    n, times = await leases(dsn, a.leases)
    print(f"{a.leases} concurrent lease attempts on a pool with K = 3: {n} granted (never more than 3), "
          f"p99 {p99(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms")
    return 0 if n <= 3 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--events", type=int, default=2000, help="events per host")
    ap.add_argument("--batch", type=int, default=2000, help="events per shipped batch")
    ap.add_argument("--windows", type=int, default=100_000)
    ap.add_argument("--ingest", type=int, default=100_000, help="events in the ingest comparison")
    ap.add_argument("--leases", type=int, default=200)
    ap.add_argument("--steady", type=float, default=60.0, metavar="SECONDS",
                    help="also the steady state: each host commits its events over this many seconds while shipping "
                         "(0: skip)")
    a = ap.parse_args()
    server = PgServer()
    try:
        dsn = server.database()
        with tempfile.TemporaryDirectory() as tmp:
            return anyio.run(main_async, a, dsn, Path(tmp))
    finally:
        server.remove()


if __name__ == "__main__":
    sys.exit(main())
