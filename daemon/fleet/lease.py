"""A pool's leases: at most `max_down` primaries of a pool taken down at once, decided by row locks.

A lease is a row of `leases`, inserted in the transaction that holds the pool's row `FOR UPDATE` and
counts the pool's rows first; a dropped connection rolls back an attempt and never frees a granted
lease (unlike a session advisory lock). Lease transactions commit synchronously, so a lease a primary
was told it holds survives the database's crash and, with synchronous replication, its failover.
Every change is recorded in `lease_log` with who made it.
"""

from __future__ import annotations

import psycopg

from flare_diag.daemon.fleet.config import FleetError


class PoolFull(FleetError):
    """The pool already has `max_down` primaries down; `holders` says which."""

    def __init__(self, pool: str, max_down: int, holders: list[tuple[str, str, str]]) -> None:
        who = ", ".join(f"{h} (window {w}, {s})" for h, w, s in holders) or "none"
        super().__init__(f"pool {pool} is full: {len(holders)} of {max_down} primaries are down: {who}")
        self.holders = holders


class NeedsPerson(FleetError):
    """This host's lease is held for a window whose restore did not verify."""


def _needs_person(host: str, window_id: str, detail: str) -> NeedsPerson:
    return NeedsPerson(f"host {host}: its lease is held for window {window_id}, whose restore did not verify "
                       f"({detail}); `flare-diag fleet lease release {host} --reason ...` once a person has restored it")


async def take(conn: psycopg.AsyncConnection, pool: str, host: str, window_id: str, caller: str) -> str:
    """'taken', or 'kept' when this host already holds a lease (a daemon resuming its own window)."""
    async with conn.transaction():
        await conn.execute("SET LOCAL synchronous_commit TO on")
        row = await (await conn.execute("SELECT max_down FROM pools WHERE pool = %s FOR UPDATE", (pool,))).fetchone()
        if row is None:
            raise FleetError(f"pool {pool} is not defined in the fleet database "
                             f"(`flare-diag fleet pool set {pool} --max-down K`)")
        max_down = row[0]
        mine = await (await conn.execute("SELECT window_id, state, detail FROM leases WHERE host = %s",
                                         (host,))).fetchone()
        if mine is not None:
            if mine[1] == "needs_a_person":
                raise _needs_person(host, mine[0], mine[2])
            return "kept"
        holders = await (await conn.execute("SELECT host, window_id, state FROM leases WHERE pool = %s ORDER BY taken_at",
                                            (pool,))).fetchall()
        if len(holders) >= max_down:
            raise PoolFull(pool, max_down, [tuple(h) for h in holders])
        await conn.execute("INSERT INTO leases (host, pool, window_id) VALUES (%s, %s, %s)", (host, pool, window_id))
        await conn.execute("INSERT INTO lease_log (pool, host, window_id, change, caller) VALUES (%s, %s, %s, 'taken', %s)",
                           (pool, host, window_id, caller))
    return "taken"


async def check_room(conn: psycopg.AsyncConnection, pool: str, host: str) -> None:
    """Raises as `take` would if the pool had no room now, taking nothing: a start refused on a full pool
    learns it before its preflight, and `take` still decides under the pool's lock."""
    row = await (await conn.execute("SELECT max_down FROM pools WHERE pool = %s", (pool,))).fetchone()
    if row is None:
        raise FleetError(f"pool {pool} is not defined in the fleet database "
                         f"(`flare-diag fleet pool set {pool} --max-down K`)")
    holders = await (await conn.execute("SELECT host, window_id, state, detail FROM leases WHERE pool = %s "
                                        "ORDER BY taken_at", (pool,))).fetchall()
    mine = next((h for h in holders if h[0] == host), None)
    if mine is not None and mine[2] == "needs_a_person":
        raise _needs_person(host, mine[1], mine[3])
    if mine is None and len(holders) >= row[0]:
        raise PoolFull(pool, row[0], [tuple(h[:3]) for h in holders])


async def release(conn: psycopg.AsyncConnection, host: str, caller: str, reason: str,
                  window_id: str | None = None) -> bool:
    """Frees this host's lease (only the one for `window_id`, when given); False when none was held."""
    async with conn.transaction():
        await conn.execute("SET LOCAL synchronous_commit TO on")
        row = await (await conn.execute("SELECT pool, window_id FROM leases WHERE host = %s FOR UPDATE",
                                        (host,))).fetchone()
        if row is None or (window_id is not None and row[1] != window_id):
            return False
        await conn.execute("DELETE FROM leases WHERE host = %s", (host,))
        await conn.execute("INSERT INTO lease_log (pool, host, window_id, change, caller, reason) "
                           "VALUES (%s, %s, %s, 'released', %s, %s)", (row[0], host, row[1], caller, reason))
    return True


async def needs_person(conn: psycopg.AsyncConnection, host: str, window_id: str, caller: str, detail: str) -> None:
    """Keeps the lease held, marked for a person: the primary it names was not restored."""
    async with conn.transaction():
        await conn.execute("SET LOCAL synchronous_commit TO on")
        cur = await conn.execute("UPDATE leases SET state = 'needs_a_person', detail = %s WHERE host = %s AND "
                                 "window_id = %s AND state = 'held' RETURNING pool", (detail, host, window_id))
        row = await cur.fetchone()
        if row is not None:
            await conn.execute("INSERT INTO lease_log (pool, host, window_id, change, caller, reason) "
                               "VALUES (%s, %s, %s, 'needs_a_person', %s, %s)", (row[0], host, window_id, caller, detail))


async def held(conn: psycopg.AsyncConnection, host: str) -> dict | None:
    row = await (await conn.execute("SELECT pool, window_id, state, taken_at, detail FROM leases WHERE host = %s",
                                    (host,))).fetchone()
    if row is None:
        return None
    return {"pool": row[0], "window_id": row[1], "state": row[2], "taken_at": row[3].isoformat(), "detail": row[4]}
