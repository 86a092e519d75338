"""Shipping a host's committed events to the fleet database, in order, in batches, with COPY.

Each batch continues the host's chain as the database holds it: under the host's row lock, the first
shipped row's `prev_hash` must equal the stored head, and the local log must still hold the stored
head itself (a log truncated or rewritten after shipping is a fork). A fork is refused on both sides:
the database keeps an alarm, the daemon logs an error and stops shipping until a person looks. The
database's own trigger on `hosts` (migrations/001_init.sql) checks the same continuity, so a shipper that
skipped these checks could not move a head past a broken link either.
"""

from __future__ import annotations

import sqlite3
import time
from itertools import compress
from operator import itemgetter
from dataclasses import dataclass
from pathlib import Path

import anyio
import psycopg

from flare_diag.daemon.fleet.config import FleetConfig
from flare_diag.daemon.fleet.dsn import FleetError
from flare_diag.daemon.fleet.db import connect, one_line
from flare_diag.events.base import decode_payload
from flare_diag.events.schema import RestorationRecorded, VerdictReached, WindowClosed, WindowOpened
from flare_diag.events.signals import quiet

COLUMNS = ("seq", "mono_ns", "wall_ns", "type", "schema_v", "window_id", "causation_seq", "payload", "prev_hash", "hash")
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM events"
# binary COPY: the bytea columns go as they are, not hex-escaped (about 30 % less time than text)
_COPY = "COPY events (host, " + ", ".join(COLUMNS) + ") FROM STDIN (FORMAT BINARY)"
COPY_TYPES = ("text", "bigint", "bigint", "bigint", "text", "integer", "text", "bigint", "bytea", "bytea", "bytea")
# the events a fleet's window list is kept from
_WINDOW_TYPES = frozenset({"window_opened", "window_closed", "verdict_reached", "restoration_recorded"})
POLL_S = 5.0  # a shipper with nothing to wake it looks again this often
BACKOFF_MAX_S = 30.0


class Fork(FleetError):
    """The local log does not continue the chain the database holds for this host."""

    def __init__(self, host: str, seq: int, detail: str) -> None:
        super().__init__(f"host {host}: fork at seq {seq}: {detail}")
        self.seq = seq


@dataclass
class Shipped:
    events: int
    head_seq: int
    local_head_seq: int
    oldest_unshipped_wall_ns: int | None


CHUNK = 5000  # rows read from the local log while the previous ones are copied


def _local_head(db: Path, after: int, host: str | None = None, small: int = 0) -> tuple[tuple | None, int, list | None]:
    """(the local row at `after` or None, the local head seq, and, when `host` is given and at most
    `small` rows follow `after`, those rows (host first): a short backlog read in the same visit)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        at = conn.execute(f"{_SELECT} WHERE seq = ?", (after,)).fetchone() if after else None
        head = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
        rows = None
        if host is not None and 0 < head - after <= small:
            rows = conn.execute(f"SELECT ?, {', '.join(COLUMNS)} FROM events WHERE seq > ? ORDER BY seq",
                                (host, after)).fetchall()
        return at, head, rows
    finally:
        conn.close()


def _read_rows(db: Path, host: str, after: int, limit: int, send) -> None:
    """Sends up to `limit` rows after `after`, CHUNK at a time, from a worker thread; each row starts
    with the host, so it goes to COPY as it was read."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        cur = conn.execute(f"SELECT ?, {', '.join(COLUMNS)} FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
                           (host, after, limit))
        while rows := cur.fetchmany(CHUNK):
            anyio.from_thread.run(send.send, rows)
    finally:
        conn.close()
        anyio.from_thread.run(send.aclose)


class _Broken(Exception):
    def __init__(self, fork: Fork) -> None:
        self.fork = fork


def _window_updates(rows: list[tuple]) -> dict[str, dict]:
    """What the shipped rows (host first) say of each window: plan, opening, closing, outcome, verdict,
    restoration, and the last seq shipped."""
    # map/itemgetter/compress keep the per-row work in C: this runs over every shipped row
    last = dict(zip(map(itemgetter(6), rows), map(itemgetter(1), rows)))
    last.pop(None, None)
    out: dict[str, dict] = {wid: {"last_seq": seq} for wid, seq in last.items() if wid}
    marked = compress(rows, map(_WINDOW_TYPES.__contains__, map(itemgetter(4), rows)))
    for _host, _seq, _mono, wall_ns, type_, schema_v, window_id, _c, payload, _p, _h in marked:
        if not window_id:
            continue
        w = out[window_id]
        ev = decode_payload(type_, schema_v, payload)
        if isinstance(ev, WindowOpened):
            w["plan"] = (ev.plan or {}).get("name")
            w["opened_at"] = wall_ns
        elif isinstance(ev, WindowClosed):
            w["closed_at"] = wall_ns
            w["outcome"] = ev.outcome
        elif isinstance(ev, VerdictReached):
            w["verdict"] = ev.hypothesis
        elif isinstance(ev, RestorationRecorded):
            w["restoration_verified"] = ev.verified
    return out


def _first_break(rows: list[tuple], prev_seq: int, prev_hash: bytes | None) -> int | None:
    """The index of the first row (host first) that does not continue the chain, or None."""
    seqs = list(map(itemgetter(1), rows))
    if seqs != list(range(prev_seq + 1, prev_seq + 1 + len(rows))):
        return next(i for i, s in enumerate(seqs) if s != prev_seq + 1 + i)
    if prev_hash is not None and rows[0][9] != prev_hash:
        return 0
    if list(map(itemgetter(10), rows[:-1])) != list(map(itemgetter(9), rows[1:])):
        return next(i + 1 for i, (a, b) in enumerate(zip(rows, rows[1:])) if a[10] != b[9])
    return None


def _check_chunk(host: str, rows: list[tuple], prev_seq: int, prev_hash: bytes | None, first: bool) -> None:
    bad = _first_break(rows, prev_seq, prev_hash)
    if bad is None:
        return
    r = rows[bad]
    expected = prev_seq + 1 + bad
    if r[1] != expected:
        raise _Broken(Fork(host, expected, f"the local log continues at seq {r[1]} (a gap)"))
    raise _Broken(Fork(host, r[1], "its prev_hash is not the hash of the event before it"
                       if not first or bad else "its prev_hash is not the shipped head's hash"))


async def _copy_rows(conn: psycopg.AsyncConnection, host: str, rows: list[tuple], head_seq: int,
                     head_hash: bytes | None) -> list[tuple]:
    """A short backlog already read: checked whole, then COPYed."""
    _check_chunk(host, rows, head_seq, head_hash, True)
    async with conn.cursor().copy(_COPY) as copy:
        copy.set_types(COPY_TYPES)
        for r in rows:
            await copy.write_row(r)
    return rows


async def _copy(conn: psycopg.AsyncConnection, host: str, db: Path, head_seq: int, head_hash: bytes | None,
                batch: int) -> list[tuple]:
    """COPYs the rows after the head as they are read; every link is checked on the way (a break
    raises _Broken, and the caller's transaction rolls the copy back)."""
    send, receive = anyio.create_memory_object_stream[list[tuple]](2)
    out: list[tuple] = []
    prev_seq, prev_hash = head_seq, head_hash
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, quiet(_read_rows), db, host, head_seq, batch, send)
            async with receive, conn.cursor().copy(_COPY) as copy:
                copy.set_types(COPY_TYPES)
                async for rows in receive:
                    # a chunk is checked whole before any of it is copied: the per-row cost stays in C
                    _check_chunk(host, rows, prev_seq, prev_hash, not out)
                    for r in rows:
                        await copy.write_row(r)
                    prev_seq, prev_hash = rows[-1][1], rows[-1][10]
                    out.extend(rows)
    except BaseExceptionGroup as group:
        # the copy and the reader fail together (a fork read, a connection lost): say the first cause
        first: BaseException = group.subgroup(_Broken) or group.subgroup(Exception) or group
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return out


_UPSERT_WINDOWS = (
    "INSERT INTO windows (host, window_id, pool, plan, opened_at, closed_at, outcome, verdict, restoration_verified, "
    "last_seq) SELECT host, window_id, pool, plan, to_timestamp(opened / 1e9), to_timestamp(closed / 1e9), outcome, "
    "verdict, restoration_verified, last_seq FROM (VALUES {values}) AS w (host, window_id, pool, plan, opened, closed, "
    "outcome, verdict, restoration_verified, last_seq) "
    "ON CONFLICT (host, window_id) DO UPDATE SET "
    "plan = COALESCE(EXCLUDED.plan, windows.plan), opened_at = COALESCE(EXCLUDED.opened_at, windows.opened_at), "
    "closed_at = COALESCE(EXCLUDED.closed_at, windows.closed_at), "
    "outcome = COALESCE(EXCLUDED.outcome, windows.outcome), verdict = COALESCE(EXCLUDED.verdict, windows.verdict), "
    "restoration_verified = COALESCE(EXCLUDED.restoration_verified, windows.restoration_verified), "
    "last_seq = EXCLUDED.last_seq")
_WINDOW_ROW = "(%s, %s, %s, %s::text, %s::bigint, %s::bigint, %s::text, %s::text, %s::boolean, %s::bigint)"
_MOVE_HEAD = ("UPDATE hosts SET head_seq = %s, head_hash = %s, last_event_at = to_timestamp(%s / 1e9), "
              "shipped_at = now() WHERE host = %s")


def _head_and_windows(host: str, pool: str, rows: list[tuple]) -> tuple[str, list]:
    """One statement that moves the host's head to the batch's last row and upserts the windows the
    batch touches (where there was a statement for each window and one for the head: a steady
    state's batch is small, and each statement costs the shipper a round trip and its CPU)."""
    last = rows[-1]
    head_args = [last[1], last[10], last[3], host]
    updates = _window_updates(rows)
    if not updates:
        return _MOVE_HEAD, head_args
    args: list = []
    for wid, w in updates.items():
        args += [host, wid, pool, w.get("plan"), w.get("opened_at"), w.get("closed_at"), w.get("outcome"),
                 w.get("verdict"), w.get("restoration_verified"), w["last_seq"]]
    upsert = _UPSERT_WINDOWS.format(values=", ".join([_WINDOW_ROW] * len(updates)))
    return f"WITH w AS ({upsert}) {_MOVE_HEAD}", args + head_args


async def ship_once(conn: psycopg.AsyncConnection, host: str, pool: str, db: Path, batch: int = 2000) -> Shipped:
    """Ships at most one batch; raises Fork when the local log does not continue the central chain."""
    fork: Fork | None = None
    try:
        async with conn.transaction():
            # the host's row, locked: known hosts (every batch but the first) in one statement
            cur = await conn.execute("SELECT head_seq, head_hash FROM hosts WHERE host = %s FOR UPDATE", (host,))
            found = await cur.fetchone()
            if found is None:
                await conn.execute("INSERT INTO hosts (host, pool) VALUES (%s, %s) ON CONFLICT (host) DO NOTHING",
                                   (host, pool))
                cur = await conn.execute("SELECT head_seq, head_hash FROM hosts WHERE host = %s FOR UPDATE", (host,))
                found = await cur.fetchone()
            assert found is not None  # the row exists: inserted above if it did not
            head_seq, head_hash = found
            head_hash = bytes(head_hash) if head_hash is not None else None
            # the head check and a short backlog in one visit to the local log (the steady state's case)
            at, local_head, short = await anyio.to_thread.run_sync(quiet(_local_head), db, head_seq, host, min(batch, CHUNK))
            if head_seq and at is not None and at[9] != head_hash:
                raise _Broken(Fork(host, head_seq, "the local log's event there differs from the one shipped "
                                                   "(rewritten after shipping)"))
            if head_seq and local_head < head_seq:
                raise _Broken(Fork(host, local_head + 1, f"the local log ends at seq {local_head}, the fleet holds up "
                                                         f"to {head_seq} (truncated after shipping)"))
            if short is not None:
                rows = await _copy_rows(conn, host, short, head_seq, head_hash)
            else:
                rows = await _copy(conn, host, db, head_seq, head_hash, batch) if local_head > head_seq else []
            if rows:
                last = rows[-1]
                sql, args = _head_and_windows(host, pool, rows)
                await conn.execute(sql, args)
                head_seq = last[1]
    except _Broken as b:
        fork = b.fork
    if fork is not None:
        async with conn.transaction():
            await conn.execute("INSERT INTO alarms (host, kind, detail) VALUES (%s, 'fork', %s)", (host, str(fork)))
        raise fork
    oldest = None
    if local_head > head_seq:
        nxt, _head, _rows = await anyio.to_thread.run_sync(quiet(_local_head), db, head_seq + 1)
        oldest = nxt[2] if nxt else None
    return Shipped(len(rows), head_seq, local_head, oldest)


class Shipper:
    """The daemon's shipping task: wakes on every commit (and every POLL_S), ships until caught up, backs
    off while the database is unreachable (the backlog waits in the local log), stops on a fork."""

    def __init__(self, cfg: FleetConfig, dsn: str, db: Path, log) -> None:
        self.cfg, self.dsn, self.db, self.log = cfg, dsn, db, log
        self.shipped_seq = 0
        self.local_seq = 0
        self.oldest_unshipped_wall_ns: int | None = None
        self.error: str | None = None
        self.fork: str | None = None
        self._wake = anyio.Event()
        self._conn: psycopg.AsyncConnection | None = None

    def committed(self, envs) -> None:
        """A store listener: never blocks, never raises."""
        if envs:
            self.local_seq = max(self.local_seq, envs[-1].seq)
            if self.oldest_unshipped_wall_ns is None:
                self.oldest_unshipped_wall_ns = envs[0].wall_ns
        self._wake.set()

    def lag(self) -> dict:
        behind = max(0, self.local_seq - self.shipped_seq)
        seconds = 0.0
        if behind and self.oldest_unshipped_wall_ns:
            seconds = max(0.0, time.time() - self.oldest_unshipped_wall_ns / 1e9)
        return {"host": self.cfg.host, "pool": self.cfg.pool, "shipped_seq": self.shipped_seq, "local_seq": self.local_seq,
                "lag_events": behind, "lag_s": round(seconds, 3), "error": self.error, "fork": self.fork}

    async def run(self) -> None:
        backoff = 1.0
        try:
            while True:
                if self.fork is not None:
                    await anyio.sleep_forever()  # a person decides; shipping on would bless the fork
                wake = self._wake = anyio.Event()  # a commit from here on wakes the wait below
                try:
                    if self._conn is None or self._conn.closed:
                        self._conn = await connect(self.dsn)
                    res = await ship_once(self._conn, self.cfg.host, self.cfg.pool, self.db, self.cfg.batch)
                except Fork as f:
                    self.fork = str(f)
                    self.log.error("fleet shipping refused: fork", host=self.cfg.host, seq=f.seq, detail=str(f))
                    continue
                except Exception as exc:  # noqa: BLE001 - the database's, the network's or ours: never the window's
                    if self.error is None:
                        self.log.warning("fleet database unreachable: events wait in the local log",
                                         error=one_line(exc), lag_events=self.lag()["lag_events"])
                    self.error = one_line(exc)
                    await self._close()
                    await anyio.sleep(backoff)
                    backoff = min(BACKOFF_MAX_S, backoff * 2)
                    continue
                if self.error is not None:
                    self.log.info("fleet database reachable again", shipped_seq=res.head_seq, local_seq=res.local_head_seq)
                self.error, backoff = None, 1.0
                self.shipped_seq, self.local_seq = res.head_seq, max(self.local_seq, res.local_head_seq)
                self.oldest_unshipped_wall_ns = res.oldest_unshipped_wall_ns
                if res.local_head_seq > res.head_seq:
                    continue  # a backlog longer than a batch
                # caught up with what the visit saw; a commit since then has set `wake` already, so the
                # empty pass that would only confirm it (three round trips) is not made
                with anyio.move_on_after(POLL_S):
                    await wake.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await self._close()

    async def _close(self) -> None:
        if self._conn is not None:
            try:
                await self._conn.close()
            except Exception:  # noqa: BLE001 - a broken connection closes as it can
                pass
            self._conn = None
