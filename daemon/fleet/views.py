"""What the fleet database says at length: reports rebuilt from shipped events, and a host's local log
checked against its shipped chain (`fleet verify`); the everyday reads are daemon/fleet/reads.py."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio

from flare_diag.daemon.fleet.dsn import FleetError
from flare_diag.daemon.fleet.db import connect
from flare_diag.events.chain import GENESIS, event_hash
from flare_diag.events.sqlschema import DDL, FORMAT, STORE_VERSION


def _local_hashes(db: Path) -> dict[int, bytes]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT seq, hash FROM events"))
    finally:
        conn.close()


async def verify_host(dsn: str, host: str, db: Path | None = None) -> dict:
    """The host's shipped chain recomputed from its rows, then (given its local log) compared with the
    local log seq by seq: the first differing seq names where the local log was rewritten or cut."""
    res: dict = {"host": host, "ok": True, "central_head_seq": 0, "first_differing_seq": None, "problem": None}
    async with await connect(dsn) as conn:
        head = await (await conn.execute("SELECT head_seq, head_hash FROM hosts WHERE host = %s", (host,))).fetchone()
        if head is None:
            return {**res, "ok": False, "problem": f"host {host} has shipped nothing"}
        res["central_head_seq"] = head[0]
        local = await anyio.to_thread.run_sync(_local_hashes, db) if db is not None else None
        if local is not None:
            res["local_head_seq"] = max(local, default=0)
        prev = None
        async with conn.cursor(name="verify") as cur:
            await cur.execute("SELECT seq, type, schema_v, mono_ns, wall_ns, window_id, causation_seq, payload, "
                              "prev_hash, hash FROM events WHERE host = %s ORDER BY seq", (host,))
            async for seq, type_, v, mono, wall, wid, cause, payload, prev_hash, h in cur:
                prev_hash, h = bytes(prev_hash), bytes(h)
                expect_prev = GENESIS if prev is None and seq == 1 else prev
                if (expect_prev is not None and prev_hash != expect_prev) or \
                        event_hash(prev_hash, seq, type_, v, mono, wall, wid, cause, bytes(payload)) != h:
                    return {**res, "ok": False, "first_differing_seq": seq,
                            "problem": f"the fleet's own chain for {host} breaks at seq {seq}"}
                prev = h
                if local is not None and res["first_differing_seq"] is None and local.get(seq) != h:
                    res.update(ok=False, first_differing_seq=seq,
                               problem=("the local log lacks seq %d (cut after shipping)" if seq not in local else
                                        "the local log's seq %d differs from the one shipped (rewritten after shipping)")
                               % seq)
        if prev is not None and bytes(head[1]) != prev:
            return {**res, "ok": False, "problem": "the fleet's head hash is not its last event's hash"}
    return res


async def rebuild_log(dsn: str, window_id: str, dest: Path) -> str:
    """The log of the host that ran `window_id`, rebuilt from the fleet's events into `dest` (a new
    SQLite log in the host's own format); returns the host's id."""
    async with await connect(dsn) as conn:
        host = await _host_of(conn, window_id)
        await _rebuild_host_log(conn, host, dest)
    return host


async def _host_of(conn, window_id: str) -> str:
    row = await (await conn.execute("SELECT host FROM windows WHERE window_id = %s", (window_id,))).fetchone()
    if row is None:
        raise FleetError(f"window {window_id}: the fleet holds no such window")
    return row[0]


async def _rebuild_host_log(conn, host: str, dest: Path) -> None:
    out = sqlite3.connect(dest)
    try:
        out.executescript(DDL)
        out.execute("INSERT INTO meta (key, value) VALUES ('format', ?), ('store_version', ?)", (FORMAT, str(STORE_VERSION)))
        async with conn.cursor(name="rebuild") as cur:
            await cur.execute("SELECT seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload, "
                              "prev_hash, hash FROM events WHERE host = %s ORDER BY seq", (host,))
            while rows := await cur.fetchmany(5000):
                out.executemany("INSERT INTO events (seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, "
                                "payload, prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                [(*r[:7], bytes(r[7]), bytes(r[8]), bytes(r[9])) for r in rows])
        out.commit()
    finally:
        out.close()


async def report(dsn: str, window_id: str) -> dict:
    """A window's report rebuilt from the fleet's events: the same fold, verification and audit as the
    host's own (reports/publish.build_report) over the same rows, hence the same bytes."""
    return (await reports(dsn, [window_id]))[window_id]


async def reports(dsn: str, window_ids: list[str]) -> dict[str, dict]:
    """The reports of several windows, each as `report` makes it: a host's log is rebuilt, verified and
    audited once for all of its windows asked for (a campaign's repeats share a host's log)."""
    import tempfile
    out: dict[str, dict] = {}
    async with await connect(dsn) as conn:
        by_host: dict[str, list[str]] = {}
        for w in window_ids:
            by_host.setdefault(await _host_of(conn, w), []).append(w)
        with tempfile.TemporaryDirectory(prefix="flare-diag-fleet-report-") as tmp:
            for n, (host, wids) in enumerate(by_host.items()):
                db = Path(tmp) / f"log-{n}.db"
                await _rebuild_host_log(conn, host, db)
                from flare_diag.daemon.reports.publish import build_reports  # reports only where one is asked for
                out.update(await anyio.to_thread.run_sync(build_reports, db, wids))
    return {w: out[w] for w in window_ids}
