"""Synchronous read-only access to a log file, for offline tools (verify, export, audit, reports)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator
from itertools import starmap
from pathlib import Path
from typing import Any

import flare_diag.events.schema  # noqa: F401  (a reader decodes every registered event type)
from flare_diag.events.envelope import Envelope, ReadEvent
from flare_diag.events.schema import ActionRequested
from flare_diag.events.sqlschema import NotAnEventLog, chain_base, check_format
from flare_diag.events.store import row_envelope, select_sql


class LogReader:
    """Opens a log read-only; refuses a file that is not a flare-diag log."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise NotAnEventLog(f"{self.path}: no such event log file")
        try:
            self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        except sqlite3.Error as exc:
            raise NotAnEventLog(f"{self.path}: cannot open as an event log ({exc})") from None
        check_format(self.conn, str(self.path))

    def iter(self, *, from_seq: int = 1, window_id: str | None = None,
             types: Iterable[str] | None = None) -> Iterator[Envelope]:
        sql, args = select_sql(from_seq, window_id, types)
        cur = self.conn.execute(sql, args)
        while rows := cur.fetchmany(4096):
            for r in rows:
                yield row_envelope(r)

    def iter_for_projection(self, window_id: str, types: Iterable[str] | None = None,
                            skip_actions: Iterable[str] = ()) -> Iterator[ReadEvent]:
        """One window's events (optionally only some types) as a fold reads them (ReadEvent).

        Verification reads the hashes; a report that has already verified the log need not carry
        them, its clocks or causation through its fold, nor the events it does not fold.
        `skip_actions`: action_requested decisions of these actions are left in the log (SQLite
        reads their action's name from the bytes, Python never sees the row).
        """
        sql = "SELECT seq, wall_ns, type, schema_v, window_id, payload FROM events WHERE window_id = ?"
        args: list[Any] = [window_id]
        if types is not None:
            ts = sorted(types)
            sql += f" AND type IN ({','.join('?' * len(ts))})"
            args += ts
        for name in skip_actions:
            # A v2 decision's bytes begin {"type":"action_requested","action_id":N,"request":{"action":"NAME",
            # (msgspec writes a struct's tag, then its fields in order), so the first `,"request":{"action":"`
            # in them is its action's name, whatever its arguments hold.
            sql += (" AND NOT (type = 'action_requested' AND schema_v = ? AND instr(payload, ?) > 0"
                    " AND substr(payload, instr(payload, ?) + ?, ?) = ?)")
            head, want = b',"request":{"action":"', name.encode() + b'"'
            args += [ActionRequested.schema_v, head, head, len(head), len(want), want]
        yield from starmap(ReadEvent, self.conn.execute(sql + " ORDER BY seq", args))

    def raw_rows(self) -> sqlite3.Cursor:
        return self.conn.execute(
            "SELECT seq, type, schema_v, mono_ns, wall_ns, window_id, causation_seq, payload, prev_hash, hash"
            " FROM events ORDER BY seq"
        )

    def chain_base(self) -> tuple[int, bytes] | None:
        """Where the chain starts when earlier rows were archived: (seq, hash) of the row before
        the first (events/archive.py), or None from genesis."""
        return chain_base(self.conn)

    def window_ids(self) -> list[str]:
        return [r[0] for r in self.conn.execute(
            "SELECT window_id FROM events WHERE window_id != '' GROUP BY window_id ORDER BY MIN(seq)")]

    def count(self) -> int:
        count: int = self.conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        return count

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
