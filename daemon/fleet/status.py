"""`fleet status`: per pool, K and who is down; per host, its head, shipping and lease; recent alarms. One
statement, read through psycopg by the daemon's side and through libpq itself by the command (issue 49)."""

from __future__ import annotations

import json

from flare_diag.daemon.fleet.dsn import CONNECT_TIMEOUT_S, FleetError, redact

# A time as datetime.isoformat(timespec="microseconds") writes psycopg's value of it: ISO 8601 in the
# session's time zone, six fractional digits (PostgreSQL's own JSON drops trailing zeros).
_ISO = """to_char({}, 'YYYY-MM-DD"T"HH24:MI:SS.USTZH:TZM')"""

# `fleet status` as one JSON document the server builds, so that every client reads the same text:
# status() through psycopg, status_now() through libpq directly.
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


async def status(dsn: str) -> dict:
    """Per pool: K and the primaries down now with who holds them; per host: its head and shipping."""
    from flare_diag.daemon.fleet.db import connect
    async with await connect(dsn) as conn:
        row = await (await conn.execute(STATUS_SQL)).fetchone()
    return document(row[0] if row else None, dsn)


def status_now(dsn: str) -> dict:
    """status(), blocking, through libpq itself: the command that asks starts in a fraction of the time
    psycopg's import takes (issue 49). FleetError as connect() words it."""
    from flare_diag.daemon.fleet import libpq
    if libpq.library() is None:
        import anyio
        return anyio.run(status, dsn)
    try:
        rows = libpq.fetch_text(dsn, STATUS_SQL, CONNECT_TIMEOUT_S)
    except libpq.LibpqError as exc:
        raise FleetError(f"fleet database {redact(dsn)}: {exc}") from None
    return document(rows[0][0] if rows else None, dsn)


def document(text: str | None, dsn: str) -> dict:
    """STATUS_SQL's one value, read (it is never NULL: every part falls back to an empty list)."""
    if text is None:
        raise FleetError(f"fleet database {redact(dsn)}: the status statement returned nothing")
    return json.loads(text)
