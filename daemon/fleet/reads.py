"""The fleet's two everyday reads: `fleet status` (per pool, K and who is down; per host, its head, shipping
and lease; recent alarms) and `fleet windows`. Each is one statement whose one value is JSON the server
builds, read through psycopg (`status`, `windows`) or, by the commands, through libpq itself (`status_now`,
`windows_now`: they start in a fraction of psycopg's import, issue 49)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from flare_diag.daemon.fleet.dsn import CONNECT_TIMEOUT_S, FleetError, redact

# A time as datetime.isoformat(timespec="microseconds") writes psycopg's value of it: ISO 8601 in the
# session's time zone, six fractional digits (PostgreSQL's own JSON drops trailing zeros).
_ISO = """to_char({}, 'YYYY-MM-DD"T"HH24:MI:SS.USTZH:TZM')"""

STATUS_SQL = """
SELECT json_build_object(
  'pools', COALESCE((SELECT json_agg(json_build_object('pool', p.pool, 'max_down', p.max_down,
      'down', (SELECT count(*) FROM leases l WHERE l.pool = p.pool),
      'held_by', COALESCE((SELECT json_agg(json_build_object('host', l.host, 'window_id', l.window_id,
          'state', l.state, 'taken_at', {taken_at}) ORDER BY l.taken_at) FROM leases l WHERE l.pool = p.pool), '[]'))
    ORDER BY p.pool) FROM pools p), '[]'),
  'hosts', COALESCE((SELECT json_agg(json_build_object('host', h.host, 'pool', h.pool, 'head_seq', h.head_seq,
      'head_hash', encode(h.head_hash, 'hex'), 'last_event_at', {last_event_at}, 'shipped_at', {shipped_at},
      'running_window', (SELECT w.window_id FROM windows w WHERE w.host = h.host AND w.closed_at IS NULL
                         ORDER BY w.opened_at DESC LIMIT 1),
      'lease', (SELECT json_build_object('window_id', l.window_id, 'state', l.state) FROM leases l
                WHERE l.host = h.host))
    ORDER BY h.host) FROM hosts h), '[]'),
  'alarms', COALESCE((SELECT json_agg(json_build_object('host', a.host, 'kind', a.kind, 'detail', a.detail,
      'at', {at}) ORDER BY a.id DESC) FROM (SELECT * FROM alarms ORDER BY id DESC LIMIT 20) a), '[]')
)::text""".format(taken_at=_ISO.format("l.taken_at"), last_event_at=_ISO.format("h.last_event_at"),
                   shipped_at=_ISO.format("h.shipped_at"), at=_ISO.format("a.at"))


def windows_sql(host: str | None, plan: str | None, verdict: str | None, since: str | None, limit: int,
                mark: Callable[[int], str]) -> tuple[str, list[str]]:
    """`fleet windows`'s statement and its parameters (as text); `mark(n)` writes the n-th placeholder."""
    where, args = [], []
    for col, val in (("host", host), ("plan", plan), ("verdict", verdict)):
        if val is not None:
            args.append(val)
            where.append(f"{col} = {mark(len(args))}")
    if since is not None:
        args.append(since)
        where.append(f"opened_at >= {mark(len(args))}::timestamptz")
    args.append(str(limit))
    rows = ("SELECT * FROM windows" + (" WHERE " + " AND ".join(where) if where else "")
            + f" ORDER BY opened_at DESC NULLS LAST LIMIT {mark(len(args))}::int")
    return ("SELECT COALESCE(json_agg(json_build_object('host', w.host, 'window_id', w.window_id, 'pool', w.pool, "
            f"'plan', w.plan, 'opened_at', {_ISO.format('w.opened_at')}, 'closed_at', {_ISO.format('w.closed_at')}, "
            "'outcome', w.outcome, 'verdict', w.verdict, 'restoration_verified', w.restoration_verified) "
            f"ORDER BY w.opened_at DESC NULLS LAST), '[]')::text FROM ({rows}) w"), args


async def status(dsn: str) -> dict:
    """Per pool: K and the primaries down now with who holds them; per host: its head and shipping."""
    return _document(await _read(dsn, STATUS_SQL, []), dsn, "status")


async def windows(dsn: str, host: str | None = None, plan: str | None = None, verdict: str | None = None,
                  since: str | None = None, limit: int = 200) -> list[dict]:
    """The newest windows first, at most `limit`, of a host, a plan, a verdict, since a time."""
    sql, args = windows_sql(host, plan, verdict, since, limit, lambda _n: "%s")
    return _document(await _read(dsn, sql, args), dsn, "windows")


def status_now(dsn: str) -> dict:
    """status(), blocking, through libpq itself."""
    return _document(_read_now(dsn, STATUS_SQL, [], status), dsn, "status")


def windows_now(dsn: str, host: str | None = None, plan: str | None = None, verdict: str | None = None,
                since: str | None = None, limit: int = 200) -> list[dict]:
    """windows(), blocking, through libpq itself."""
    sql, args = windows_sql(host, plan, verdict, since, limit, lambda n: f"${n}")
    return _document(_read_now(dsn, sql, args, lambda d: windows(d, host, plan, verdict, since, limit)), dsn, "windows")


async def _read(dsn: str, sql: str, args: list[str]) -> str | None:
    from flare_diag.daemon.fleet.db import connect
    async with await connect(dsn) as conn:
        row = await (await conn.execute(sql, args)).fetchone()
    return row[0] if row else None


def _read_now(dsn: str, sql: str, args: list[str], fallback: Callable[[str], Awaitable[Any]]) -> Any:
    """The statement's one value through libpq; FleetError as db.connect words it. Where no libpq loads,
    the same through psycopg (`fallback(dsn)`, already read)."""
    from flare_diag.daemon.fleet import libpq
    if libpq.library() is None:
        import anyio
        return anyio.run(fallback, dsn)
    try:
        rows = libpq.fetch_text(dsn, sql, CONNECT_TIMEOUT_S, args)
    except libpq.LibpqError as exc:
        raise FleetError(f"fleet database {redact(dsn)}: {exc}") from None
    return rows[0][0] if rows else None


def _document(value: Any, dsn: str, what: str) -> Any:
    """A statement's JSON value, read (it is never NULL: every part falls back to an empty list)."""
    if value is None:
        raise FleetError(f"fleet database {redact(dsn)}: the {what} statement returned nothing")
    return json.loads(value) if isinstance(value, str) else value
