"""Where a foreground window's log and reports go when its own folder stopped taking writes (disk full, I/O
error, a read-only file system): a copy of the log with every event kept in memory appended, elsewhere."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
from collections.abc import Sequence
from pathlib import Path

import msgspec

from flare_diag.daemon.reports.publish import write_reports
from flare_diag.events.store import EventStore, StoreWriteError

FALLBACK_ENV = "FLARE_DIAG_FALLBACK_DIR"  # where the copy goes first; then $XDG_STATE_HOME, then the temp folder


def fallback_roots() -> list[Path]:
    """The folders tried for the copy, in order: the operator's choice, the user's state folder, the
    temporary folder (often another file system than the one that filled)."""
    roots = [os.environ.get(FALLBACK_ENV), os.environ.get("XDG_STATE_HOME")
             or str(Path.home() / ".local" / "state"), tempfile.gettempdir()]
    return [Path(r) / "flare-diag" if i == 1 else Path(r) for i, r in enumerate(roots) if r]


def _copy_log(db: Path, dest: Path) -> None:
    """What the log committed, WAL included, into `dest` (SQLite's online backup: never a torn copy)."""
    src = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        out = sqlite3.connect(dest)
        try:
            src.backup(out)
        finally:
            out.close()
    finally:
        src.close()


async def complete_elsewhere(db: Path, window_id: str, unlogged: Sequence[Sequence[object]],
                             durable: bool) -> tuple[dict, Path] | None:
    """The window's log copied to the first fallback folder that takes it, the events its own log could
    not take appended in order (the chain goes on from the copied head), and its reports written beside
    it: (the report, the folder). None when no folder took them."""
    for root in fallback_roots():
        try:
            root.mkdir(parents=True, exist_ok=True)
            folder = Path(tempfile.mkdtemp(prefix=f"{window_id}-", dir=root))
            await asyncio.to_thread(_copy_log, db, folder / "log.db")
            store = await EventStore.open(folder / "log.db", durable=durable)
            try:
                for batch in unlogged:
                    await store.submit_many(list(batch), window_id=window_id, caused_by_first=True)  # type: ignore[arg-type]  # the runner keeps them as plain lists of events
                await store.flush()
            finally:
                await store.close()
            return await asyncio.to_thread(write_reports, folder / "log.db", window_id, folder), folder
        except (OSError, sqlite3.Error, StoreWriteError):
            continue
    return None


def report_as_json_line(db: Path, window_id: str) -> bytes | None:
    """The last resort: the report of what the log itself holds, as one JSON line (None: not even that)."""
    from flare_diag.daemon.reports.publish import build_report
    try:
        return msgspec.json.encode(build_report(db, window_id)) + b"\n"
    except Exception:  # noqa: BLE001 - a log the failing disk left unreadable: nothing to print
        return None
