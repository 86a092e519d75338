"""The SQLite layout of the log: tables, append-only triggers, and the format marker."""

from __future__ import annotations

import sqlite3

from flare_diag.events.base import BadEventError

FORMAT = "flare-diag.events"
STORE_VERSION = 1
BASE_KEY = "chain_base:"  # meta key prefix: chain_base:<seq> = hex hash of that seq (the row before the first)

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY,
  mono_ns INTEGER NOT NULL,
  wall_ns INTEGER NOT NULL,
  type TEXT NOT NULL,
  schema_v INTEGER NOT NULL,
  window_id TEXT NOT NULL,
  causation_seq INTEGER,
  payload BLOB NOT NULL,
  prev_hash BLOB NOT NULL,
  hash BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS events_window ON events(window_id, seq);
CREATE INDEX IF NOT EXISTS events_type ON events(type, seq);
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
  BEGIN SELECT RAISE(ABORT, 'flare-diag event log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
  BEGIN SELECT RAISE(ABORT, 'flare-diag event log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS meta_no_update BEFORE UPDATE ON meta
  BEGIN SELECT RAISE(ABORT, 'flare-diag event log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS meta_no_delete BEFORE DELETE ON meta
  BEGIN SELECT RAISE(ABORT, 'flare-diag event log is append-only'); END;
"""

INSERT = (
    "INSERT INTO events (seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload,"
    " prev_hash, hash) VALUES (?,?,?,?,?,?,?,?,?,?)"
)


# The store's batch insert: ?1 is a JSON array of [seq, mono_ns, wall_ns, type, schema_v, window_id,
# causation_seq, payload offset (1-based), payload length] per event, ?2 the payloads concatenated,
# ?3 the previous head hash followed by each event's hash (so row k's prev_hash is hash k-1).
# No ORDER BY: every row names its own seq (the table's key), so the order SQLite inserts them in
# changes nothing stored; with one, SQLite copied the whole batch, payloads and all, through a
# temporary sorter first (EXPLAIN QUERY PLAN: USE TEMP B-TREE FOR ORDER BY), a fifth of the INSERT's
# time for 100 events of 5.4 KB (docs/performance.md, session 36).
BULK_INSERT = (
    "INSERT INTO events (seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload,"
    " prev_hash, hash) SELECT j.value->>0, j.value->>1, j.value->>2, j.value->>3, j.value->>4,"
    " j.value->>5, j.value->>6, substr(?2, j.value->>7, j.value->>8), substr(?3, j.key * 32 + 1, 32),"
    " substr(?3, j.key * 32 + 33, 32) FROM json_each(?1) AS j"
)


EVENT_COLUMNS = "seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload, prev_hash, hash"


class NotAnEventLog(ValueError):
    """The file is not a flare-diag event log, or was written by a newer store format."""


def check_format(conn: sqlite3.Connection, path: str) -> None:
    """Raises NotAnEventLog with one line naming the file and what was expected."""
    try:
        rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        raise NotAnEventLog(f"{path}: not a flare-diag event log ({exc})") from None
    if rows.get("format") != FORMAT:
        raise NotAnEventLog(f"{path}: not a flare-diag event log (no {FORMAT!r} marker)")
    try:
        version = int(rows.get("store_version", "0"))
    except (TypeError, ValueError):
        raise NotAnEventLog(f"{path}: not a flare-diag event log (store_version {rows.get('store_version')!r})") from None
    if version > STORE_VERSION:
        raise NotAnEventLog(
            f"{path}: event log store_version {version} is newer than this build's {STORE_VERSION}; upgrade flare-diag"
        )
    try:  # the marker alone is not a log: its events table must have the columns every reader selects
        conn.execute(f"SELECT {EVENT_COLUMNS} FROM events LIMIT 0").fetchall()
    except sqlite3.DatabaseError as exc:
        raise NotAnEventLog(f"{path}: not a flare-diag event log (its events table: {exc})") from None


def chain_base(conn: sqlite3.Connection) -> tuple[int, bytes] | None:
    """Where a log's chain starts when earlier rows were archived: (seq, hash) of the row before its first."""
    rows = conn.execute("SELECT key, value FROM meta WHERE key LIKE ?", (BASE_KEY + "%",)).fetchall()
    if not rows:
        return None
    try:
        key, value = max(rows, key=lambda r: int(r[0][len(BASE_KEY):]))
        return int(key[len(BASE_KEY):]), bytes.fromhex(value)
    except (ValueError, TypeError):  # junk meta: the log cannot say where its chain starts
        raise BadEventError(f"meta {BASE_KEY}<seq>: expected a sequence number and a hex hash, found "
                            f"{[str(k)[:40] for k, _v in rows][:3]}") from None
