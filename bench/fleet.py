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
import os
import resource
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flare_diag.daemon.fleet import lease  # noqa: E402
from flare_diag.daemon.fleet.reads import status as status_view, windows as windows_view  # noqa: E402
from flare_diag.daemon.fleet.db import connect, migrate  # noqa: E402
from flare_diag.daemon.fleet.shipper import COPY_TYPES, ship_once  # noqa: E402
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


_RAW_COPY = ("COPY raw_events (host, seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload, prev_hash, "
             "hash) FROM STDIN (FORMAT BINARY)")
_SELECT_ROWS = ("SELECT ?, seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload, prev_hash, hash "
                "FROM events ORDER BY seq")


def read_log(path: Path, host: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(_SELECT_ROWS, (host,)).fetchall()
    finally:
        conn.close()


async def raw_copy(conn: psycopg.AsyncConnection, rows: list[tuple]) -> None:
    async with conn.transaction():
        async with conn.cursor().copy(_RAW_COPY) as copy:
            copy.set_types(COPY_TYPES)
            for row in rows:
                await copy.write_row(row)


async def ingest(dsn: str, tmp: Path, n: int, rounds: int = 3) -> tuple[float, float, float]:
    """(best shipper seconds, best equal-work seconds, best raw-from-memory seconds) for the same n rows,
    alternated. The equal-work floor reads the same rows from the same local log and COPYs them, the
    format the shipper uses, with no checks, window rows or head; the raw side COPYs rows already in
    memory."""
    log = tmp / "ingest.db"
    make_log(log, n, time.time_ns())
    ship_t, floor_t, raw_t = [], [], []
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
            await raw_copy(conn, await anyio.to_thread.run_sync(read_log, log, f"floor-{r}"))
            floor_t.append(time.perf_counter() - t0)
            rows = read_log(log, f"raw-{r}")
            t0 = time.perf_counter()
            await raw_copy(conn, rows)
            raw_t.append(time.perf_counter() - t0)
    return min(ship_t), min(floor_t), min(raw_t)


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


async def _steady_hosts(dsn: str, tmp: Path, names: list[str], events: int, seconds: float, connections: int,
                       start_at: float) -> list[float]:
    """One process's share of the steady state: its hosts' writers and shippers. A shipper wakes on its
    writer's commit (the daemon's store wakes its shipper the same way) and ships until caught up."""
    import random

    burst = 100
    bursts = max(1, events // burst)
    committed: dict[str, dict[int, float]] = {n: {} for n in names}
    wakes = {n: anyio.Event() for n in names}
    paths, logs = {}, {}
    for n in names:
        p = tmp / f"{n}.db"
        # each host's log as its daemon's store keeps it: open for the whole run, in WAL mode, so that
        # the shipper's reads never wait on the writer's lock (with a rollback journal they do, for
        # SQLite's busy-wait sleeps, and the lag measured that instead of the shipping)
        c = sqlite3.connect(p, check_same_thread=False)
        c.executescript(DDL)
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=OFF")
        logs[n], paths[n] = c, p
    send, recv = anyio.create_memory_object_stream[psycopg.AsyncConnection](connections)
    for _ in range(connections):
        send.send_nowait(await connect(dsn))
    lags: list[float] = []
    rng = random.Random(hash(names[0]) & 0xFFFF)

    def make_bursts(name: str) -> list[list[tuple]]:
        prev, out = GENESIS, []
        for b in range(bursts):
            rows = []
            for seq in range(b * burst + 1, (b + 1) * burst + 1):
                payload = PAYLOAD % (seq, seq, seq, hashlib.sha256(b"%d" % seq).hexdigest().encode())
                h = event_hash(prev, seq, "request_done", 1, seq, seq, name, None, payload)
                rows.append((seq, seq, seq, "request_done", 1, name, None, payload, prev, h))
                prev = h
            out.append(rows)
        return out

    # the hosts' own work (encoding, chaining, the local fsync) is done beforehand or skipped: on a fleet
    # each host pays it on its own machine, and here it would take the two cores the shipping path needs
    prepared = {n: make_bursts(n) for n in names}

    writes_cpu = [0.0]

    def write_burst(c: sqlite3.Connection, rows: list[tuple]) -> None:
        t0 = _thread_cpu()
        c.executemany("INSERT INTO events (seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload, "
                      "prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        c.commit()
        writes_cpu[0] += _thread_cpu() - t0

    async def writer(name: str) -> None:
        await anyio.sleep(rng.random() * seconds / bursts)
        for b, rows in enumerate(prepared[name]):
            await anyio.to_thread.run_sync(write_burst, logs[name], rows)
            now = time.perf_counter()
            for s in range(b * burst + 1, (b + 1) * burst + 1):
                committed[name][s] = now
            wakes[name].set()
            await anyio.sleep(seconds / bursts)

    async def shipper(name: str) -> None:
        head = 0
        while head < bursts * burst:
            wake = wakes[name] = anyio.Event()
            conn = await recv.receive()
            try:
                res = await ship_once(conn, name, "steady", paths[name], 2000)
            finally:
                send.send_nowait(conn)
            if res.events:
                oldest = res.head_seq - res.events + 1
                lags.append(time.perf_counter() - committed[name][oldest])
                head = res.head_seq
            if head < bursts * burst and res.local_head_seq <= res.head_seq:  # caught up with what it saw: wait, as the daemon does
                with anyio.move_on_after(5.0):  # the daemon's poll, should a wake be missed
                    await wake.wait()

    await anyio.sleep(max(0.0, start_at - time.time()))
    cpu0, t0 = _process_cpu(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for n in names:
            tg.start_soon(writer, n)
            tg.start_soon(shipper, n)
    phase = {"wall_s": time.perf_counter() - t0, "cpu_s": _process_cpu() - cpu0, "writes_s": writes_cpu[0]}
    for c in logs.values():
        c.close()
    while True:
        try:
            conn = recv.receive_nowait()
        except anyio.WouldBlock:
            break
        await conn.close()
    return lags, phase


def _process_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process
    return r.ru_utime + r.ru_stime


def _thread_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_THREAD)  # Linux: the calling thread alone
    return r.ru_utime + r.ru_stime


def _steady_process(args: tuple) -> tuple[list[float], dict]:
    """(its batches' lags, its phase's wall time and CPU seconds, and of those its hosts' local writes)."""
    return anyio.run(_steady_hosts, *args)


def server_cpu_s(data: Path) -> float:
    """CPU seconds the PostgreSQL server has spent: the postmaster, its exited children (reaped, so
    counted in its own cutime/cstime) and its live ones (from /proc; Linux only)."""
    tick = os.sysconf("SC_CLK_TCK")
    pm = int((data / "postmaster.pid").read_text().split()[0])

    def fields(pid: int) -> list[str]:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

    f = fields(pm)
    total = sum(int(x) for x in f[11:15])  # utime stime cutime cstime
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != pm:
            try:
                g = fields(int(d.name))
            except OSError:
                continue
            if int(g[1]) == pm:  # ppid
                total += int(g[11]) + int(g[12])
    return total / tick


def steady(dsn: str, tmp: Path, hosts: int, events: int, seconds: float, procs: int,
           connections: int = 60, data: Path | None = None) -> tuple[list[float], dict]:
    """Steady state: every host commits its events in bursts of 100 spread over `seconds` while its
    shipper ships. The hosts are spread over `procs` processes (on a fleet each host is a daemon of its
    own; one Python process for 1,000 of them measures that process, not the shipping), sharing
    `connections` as a pooler would. The lag of a batch: from the local commit of its oldest event to
    the batch's commit centrally."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    names = [f"steady-{h:04d}" for h in range(hosts)]
    procs = max(1, min(procs, hosts))
    # every process has made its logs, its hosts' events and its connections by then (a late one starts at once)
    start_at = time.time() + 3.0 + hosts * events / 100_000
    shares = [(dsn, tmp, names[i::procs], events, seconds, max(1, connections // procs), start_at) for i in range(procs)]
    with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_steady_process, share) for share in shares]
        # the server's CPU from the phase's start (every process has set up by then) to its end
        time.sleep(max(0.0, start_at - time.time()))
        server0 = server_cpu_s(data) if data is not None else None
        parts = [f.result() for f in futures]
        server_s = server_cpu_s(data) - server0 if data is not None else None
    cpu = {"wall_s": max(p["wall_s"] for _l, p in parts), "hosts_s": sum(p["cpu_s"] for _l, p in parts),
           "writes_s": sum(p["writes_s"] for _l, p in parts), "server_s": server_s}
    return [lag for lags, _p in parts for lag in lags], cpu


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


async def main_async(a: argparse.Namespace, dsn: str, tmp: Path, data: Path | None = None) -> int:
    await migrate(dsn)
    ship_s, floor_s, raw_s = await ingest(dsn, tmp, a.ingest)
    print(f"ingest of {a.ingest} events (binary COPY on every side): shipper {ship_s * 1000:.0f} ms; the equal-work "
          f"floor (read the same log, COPY) {floor_s * 1000:.0f} ms, ratio {floor_s / ship_s:.2f}x (goal >= 0.8); "
          f"raw COPY from memory {raw_s * 1000:.0f} ms, ratio {raw_s / ship_s:.2f}x")
    lags = await many_hosts(dsn, tmp, a.hosts, a.events, a.batch)
    print(f"{a.hosts} hosts x {a.events} events, all committed before shipping starts, shipped concurrently (the "
          f"backlog's drain, the worst case): {len(lags)} batches, lag p50 "
          f"{statistics.median(lags):.3f} s, p99 {p99(lags):.3f} s, max {max(lags):.3f} s (goal p99 < 1 s)")
    if a.steady:
        lags, cpu = await anyio.to_thread.run_sync(steady, dsn, tmp, a.hosts, a.events, a.steady, a.procs, 60, data)
        print(f"{a.hosts} hosts x {a.events} events committed over {a.steady:g} s while shipping (steady state, "
              f"{a.events * a.hosts / a.steady:,.0f} events a second in all, the hosts in {a.procs} processes): "
              f"{len(lags)} batches, lag p50 "
              f"{statistics.median(lags):.3f} s, p99 {p99(lags):.3f} s, max {max(lags):.3f} s (goal p99 < 1 s)")
        # what the load asked of this machine, in cores busy on average over the phase: a lag above the
        # goal where the sum nears the machine's cores measures the machine, not the shipping
        w = cpu["wall_s"]
        ship = cpu["hosts_s"] - cpu["writes_s"]
        server = cpu["server_s"]
        print(f"   CPU over the phase's {w:.1f} s: shipping {ship:.1f} s ({ship / w:.2f} cores, "
              f"{1000 * ship / max(a.hosts * a.events, 1):.3f} ms an event), the hosts' own local commits "
              f"{cpu['writes_s']:.1f} s ({cpu['writes_s'] / w:.2f} cores), the server "
              + (f"{server:.1f} s ({server / w:.2f} cores)" if server is not None else "(not measured)")
              + f"; in all {(cpu['hosts_s'] + (server or 0.0)) / w:.2f} of this machine's {os.cpu_count()} cores")
    await seed_windows(dsn, a.hosts, a.windows)
    st = await timed(status_view, dsn)
    wl = await timed(windows_view, dsn, None, None, "not_reproduced", None)
    wh = await timed(windows_view, dsn, "host-0001", None, None, None)
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
    ap.add_argument("--procs", type=int, default=4,
                    help="processes the steady state's hosts are spread over (each host is a daemon of its own)")
    a = ap.parse_args()
    server = PgServer()
    try:
        dsn = server.database()
        with tempfile.TemporaryDirectory() as tmp:
            return anyio.run(main_async, a, dsn, Path(tmp), server.data)
    finally:
        server.remove()


if __name__ == "__main__":
    sys.exit(main())
