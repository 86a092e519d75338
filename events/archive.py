"""A log's lifecycle: closed windows moved out into a dated archive log without breaking either
chain, and consistent backups of a log in use.

The archive is an exact prefix of the live chain: the same rows, the same hashes. It records where
its chain starts (`chain_base` in its meta table: the seq and hash just before its first row, or
none when it starts at genesis), so it verifies on its own. The live log first appends a
`log_archived` event naming the archive's last seq and head hash (so the hand-over is itself in the
chain, under the live log's checkpoint), then drops the archived rows and records the same base.
A verifier of the live log accepts a chain that starts after genesis only with both: the base in
the meta table and a `log_archived` event in the chain that names it.
"""

from __future__ import annotations

import asyncio
import calendar
import os
import sqlite3
import time
from pathlib import Path

import msgspec

from flare_diag.events.checkpoint import default_path, read_checkpoint, write_checkpoint
from flare_diag.events.reader import LogReader
from flare_diag.events.schema import LogArchived
from flare_diag.events.sqlschema import BASE_KEY, DDL, FORMAT, STORE_VERSION, chain_base
from flare_diag.events.store import EventStore, split_ddl, writer_lock
from flare_diag.events.verify import verify_log

COLUMNS = "seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload, prev_hash, hash"


class ArchiveError(ValueError):
    """The log cannot be archived as asked (one line, for the operator)."""


class Archived(msgspec.Struct, frozen=True):
    archive: str
    windows: list[str]
    first_seq: int
    last_seq: int
    head_hash: str
    events: int


class _Window(msgspec.Struct):
    window_id: str
    first_seq: int
    last_seq: int
    closed_wall_ns: int | None


def _windows(conn: sqlite3.Connection) -> list[_Window]:
    rows = conn.execute(
        "SELECT window_id, MIN(seq), MAX(seq), MAX(CASE WHEN type = 'window_closed' THEN wall_ns END)"
        " FROM events WHERE window_id != '' GROUP BY window_id ORDER BY MIN(seq)").fetchall()
    return [_Window(*r) for r in rows]


def _cut(windows: list[_Window], before_ns: int) -> list[_Window]:
    """The leading windows that closed before the date; the first one that did not ends the run
    (an archive is a prefix of the chain)."""
    out: list[_Window] = []
    for w in windows:
        if w.closed_wall_ns is None or w.closed_wall_ns >= before_ns:
            break
        if out and w.first_seq <= out[-1].last_seq:  # interleaved with the one before: not a clean prefix
            break
        out.append(w)
    return out


def parse_day(before: str) -> int:
    """YYYY-MM-DD (UTC) as the wall-clock ns of its first instant."""
    try:
        return calendar.timegm(time.strptime(before, "%Y-%m-%d")) * 10**9
    except ValueError:
        raise ArchiveError(f"--before {before!r}: expected a date, YYYY-MM-DD (UTC)") from None


def archive_log(db: Path, before: str, to: Path, key: bytes | None = None) -> Archived | None:
    """Moves the windows that closed before `before` (YYYY-MM-DD, UTC) into a new archive log in `to`;
    None when there is nothing to move. Holds the log's writer lock throughout (a running daemon
    archives its own log instead: `prepare_archive`, its store's append, `drop_archived`)."""
    before_ns = parse_day(before)
    if not db.is_file():
        raise ArchiveError(f"{db}: no such event log file")
    with writer_lock(db) as locked:
        if not locked:
            raise ArchiveError(f"{db}: another process is writing this log (a window, or the daemon: then run "
                               "`flare-diag log archive --before DATE` without DB, and the daemon archives its own log)")
        done = prepare_archive(db, before_ns, to, key)
        if done is None:
            return None
        asyncio.run(_record(db, done, key))  # the hand-over goes into the live chain before a row leaves it
        drop_archived(db, done, vacuum=True)
        return done


def prepare_archive(db: Path, before_ns: int, to: Path, key: bytes | None) -> Archived | None:
    """Writes the archive log of the leading windows closed before `before_ns` (verified, with its
    checkpoint) and says what it holds; the live log is not changed. The caller holds the writer
    lock, or is the log's writer."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        moved = _cut(_windows(conn), before_ns)
        if not moved:
            return None
        base = chain_base(conn)
        first = (base[0] if base else 0) + 1
        # the daemon's own events after the last moved window go with it, up to the next window: among
        # them an earlier archive's hand-over, which this archive then needs to verify on its own
        rest = [w.first_seq for w in _windows(conn) if w.first_seq > moved[-1].last_seq]
        last = (min(rest) - 1) if rest else conn.execute("SELECT MAX(seq) FROM events").fetchone()[0]
        head = conn.execute("SELECT hash FROM events WHERE seq = ?", (last,)).fetchone()
        if head is None or conn.execute("SELECT MIN(seq) FROM events").fetchone()[0] != first:
            raise ArchiveError(f"{db}: the log does not start where its recorded base says (seq {first}); verify it first")
        day = time.strftime("%Y%m%d", time.gmtime(moved[-1].closed_wall_ns // 10**9))  # type: ignore[operator]  # a window archived has closed: its closed_wall_ns is set
        target = to / f"{db.stem}-archive-{day}-seq{first}-{last}.db"
        if target.exists():
            raise ArchiveError(f"{target}: already exists")
        try:
            to.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArchiveError(f"{to}: cannot create the archive folder ({exc.strerror})") from None
        n = _write_archive(conn, target, first, last, base, key)
        return Archived(archive=str(target), windows=[w.window_id for w in moved], first_seq=first, last_seq=last,
                        head_hash=bytes(head[0]).hex(), events=n)
    finally:
        conn.close()


def hand_over(done: Archived) -> LogArchived:
    """The event the live log appends before it drops the archived rows."""
    return LogArchived(archive=done.archive, first_seq=done.first_seq, last_seq=done.last_seq,
                       head_hash=done.head_hash, windows=done.windows, events=done.events)


def drop_archived(db: Path, done: Archived, vacuum: bool = False) -> None:
    """Drops the archived rows from the live log and records where its chain now starts, in one
    transaction; only after its `log_archived` event is committed."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DROP TRIGGER events_no_delete")
            conn.execute("DELETE FROM events WHERE seq <= ?", (done.last_seq,))
            conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (f"{BASE_KEY}{done.last_seq}", done.head_hash))
            conn.execute("CREATE TRIGGER events_no_delete BEFORE DELETE ON events"
                         " BEGIN SELECT RAISE(ABORT, 'flare-diag event log is append-only'); END")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if vacuum:  # offline only: the moved rows' pages go back to the file system
            conn.execute("VACUUM")
    finally:
        conn.close()


def backup_log(db: Path, dest: Path) -> tuple[int, str]:
    """A consistent copy of a log that may be in use, through SQLite's online backup API, with the
    checkpoint as it was before the copy began (it may lag the copy, never lead it); the copy is
    verified before it is kept. Returns the copy's (head seq, head hash)."""
    if not db.is_file():
        raise ArchiveError(f"{db}: no such event log file")
    if dest.exists():
        raise ArchiveError(f"{dest}: already exists; a backup never overwrites a file")
    cp_src = default_path(db)
    cp = read_checkpoint(cp_src)
    tmp = dest.with_name(dest.name + ".partial")
    tmp.unlink(missing_ok=True)
    src = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        out = sqlite3.connect(tmp)
        try:
            src.backup(out)
            out.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
        finally:
            out.close()
    finally:
        src.close()
    with LogReader(tmp) as r:
        res = verify_log(r, cp)
    if not res.ok:
        tmp.unlink()
        raise ArchiveError(f"{db}: the copy does not verify ({res.problem}); nothing kept")
    os.replace(tmp, dest)
    if cp is not None:
        default_path(dest).write_bytes(cp_src.read_bytes())
    return res.head_seq, res.head_hash


def _write_archive(conn: sqlite3.Connection, target: Path, first: int, last: int, base: tuple[int, bytes] | None,
                   key: bytes | None) -> int:
    tmp = target.with_name(target.name + ".partial")
    tmp.unlink(missing_ok=True)
    out = sqlite3.connect(tmp, isolation_level=None)
    try:
        out.execute("PRAGMA journal_mode=DELETE")
        out.execute("BEGIN")
        for stmt in split_ddl(DDL):
            out.execute(stmt)
        meta = [("format", FORMAT), ("store_version", str(STORE_VERSION))]
        if base is not None:
            meta.append((f"{BASE_KEY}{base[0]}", base[1].hex()))
        out.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", meta)
        cur = conn.execute(f"SELECT {COLUMNS} FROM events WHERE seq BETWEEN ? AND ? ORDER BY seq", (first, last))
        n = 0
        while rows := cur.fetchmany(8192):
            out.executemany(f"INSERT INTO events ({COLUMNS}) VALUES ({','.join('?' * 10)})", rows)
            n += len(rows)
        out.execute("COMMIT")
        head = out.execute("SELECT hash FROM events WHERE seq = ?", (last,)).fetchone()[0]
    finally:
        out.close()
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, target)
    write_checkpoint(default_path(target), last, bytes(head), key)
    return n


async def _record(db: Path, done: Archived, key: bytes | None) -> None:
    store = await EventStore.open(db, lock=False)  # the caller holds the writer lock
    store.checkpoint_key = key
    try:
        await store.append(hand_over(done))
    finally:
        await store.close()
