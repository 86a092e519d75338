"""A pool's leases: at most `max_down` primaries of a pool taken down at once, each lease a window's.

A lease is a row of `leases`, inserted in a transaction that holds the pool's advisory lock (scoped to
the transaction: a dropped connection rolls back an attempt and frees the lock, never a granted lease)
and counts the pool's rows first. A lease belongs to one window (as an etcd lease to its holder's
session): taken, kept, marked and released by (host, window id), so a delayed release of a host's
earlier window can never free the lease its next window runs under. Every grant carries a fencing
epoch from the `lease_epoch` sequence, which the daemon writes into the window's local log and reads
back when it re-asserts the lease. Lease transactions commit synchronously, so a lease a primary was
told it holds survives the database's crash and, with synchronous replication, its failover. Every
change is recorded in `lease_log` with who made it and the epoch.
"""

from __future__ import annotations

from typing import NamedTuple

import psycopg

from flare_diag.daemon.fleet.dsn import FleetError


class Grant(NamedTuple):
    """What `take` answers: 'taken' or 'kept', and the lease's fencing epoch."""

    how: str
    epoch: int


class HeldByAnotherWindow(FleetError):
    """This host's lease belongs to an earlier window whose release has not happened yet."""


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


async def _lock_pool(conn: psycopg.AsyncConnection, pool: str) -> int:
    """The pool's max_down, under the pool's advisory lock for the rest of this transaction."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('flare_diag.pool:' || %s, 0))", (pool,))
    row = await (await conn.execute("SELECT max_down FROM pools WHERE pool = %s", (pool,))).fetchone()
    if row is None:
        raise FleetError(f"pool {pool} is not defined in the fleet database "
                         f"(`flare-diag fleet pool set {pool} --max-down K`)")
    return row[0]


async def take(conn: psycopg.AsyncConnection, pool: str, host: str, window_id: str, caller: str) -> Grant:
    """A lease for this window: 'taken', or 'kept' when this window already holds it (a daemon resuming
    it). A lease the host holds for another window refuses (HeldByAnotherWindow, or NeedsPerson)."""
    async with conn.transaction():
        await conn.execute("SET LOCAL synchronous_commit TO on")
        max_down = await _lock_pool(conn, pool)
        mine = await (await conn.execute("SELECT window_id, state, detail, epoch FROM leases WHERE host = %s",
                                         (host,))).fetchone()
        if mine is not None:
            if mine[1] == "needs_a_person":
                raise _needs_person(host, mine[0], mine[2])
            if mine[0] == window_id:
                return Grant("kept", mine[3])
            raise HeldByAnotherWindow(f"host {host} still holds the lease of its earlier window {mine[0]} (epoch "
                                      f"{mine[3]}), whose release has not happened yet; try again once it has")
        holders = await (await conn.execute("SELECT host, window_id, state FROM leases WHERE pool = %s ORDER BY taken_at",
                                            (pool,))).fetchall()
        if len(holders) >= max_down:
            raise PoolFull(pool, max_down, [tuple(h) for h in holders])
        cur = await conn.execute("INSERT INTO leases (host, pool, window_id) VALUES (%s, %s, %s) RETURNING epoch",
                                 (host, pool, window_id))
        epoch = (await cur.fetchone())[0]  # type: ignore[index]  # RETURNING gives the row inserted
        await conn.execute("INSERT INTO lease_log (pool, host, window_id, change, caller, epoch) "
                           "VALUES (%s, %s, %s, 'taken', %s, %s)", (pool, host, window_id, caller, epoch))
    return Grant("taken", epoch)


async def reassert(conn: psycopg.AsyncConnection, host: str, window_id: str, epoch: int) -> str | None:
    """None while this window's lease is held under `epoch`; else what the database holds instead."""
    row = await (await conn.execute("SELECT window_id, epoch, state FROM leases WHERE host = %s", (host,))).fetchone()
    if row is None:
        return f"host {host} holds no lease (window {window_id}'s, epoch {epoch}, is gone)"
    if row[0] != window_id or row[1] != epoch:
        return f"host {host}'s lease is window {row[0]}'s under epoch {row[1]}, not window {window_id}'s under epoch {epoch}"
    return None


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
    """Frees this host's lease: only the one for `window_id` when given (compare-and-delete, as a
    daemon releases), any when not (a person's `fleet lease release`); False when none was freed."""
    async with conn.transaction():
        await conn.execute("SET LOCAL synchronous_commit TO on")
        if window_id is None:
            cur = await conn.execute("DELETE FROM leases WHERE host = %s RETURNING pool, window_id, epoch", (host,))
        else:
            cur = await conn.execute("DELETE FROM leases WHERE host = %s AND window_id = %s RETURNING pool, window_id, epoch",
                                     (host, window_id))
        row = await cur.fetchone()
        if row is None:
            return False
        await conn.execute("INSERT INTO lease_log (pool, host, window_id, change, caller, reason, epoch) "
                           "VALUES (%s, %s, %s, 'released', %s, %s, %s)", (row[0], host, row[1], caller, reason, row[2]))
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
    row = await (await conn.execute("SELECT pool, window_id, state, taken_at, detail, epoch FROM leases WHERE host = %s",
                                    (host,))).fetchone()
    if row is None:
        return None
    return {"pool": row[0], "window_id": row[1], "state": row[2], "taken_at": row[3].isoformat(), "detail": row[4],
            "epoch": row[5]}
