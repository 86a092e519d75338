"""Building a window's report from a log file, rendering it, and publishing dated snapshots."""

from __future__ import annotations

import os
import time
from pathlib import Path

from events.checkpoint import default_path, read_checkpoint
from events.reader import LogReader
from events.report import PROJECTED_TYPES, project, render_json
from events.report_html import render_html
from events.report_md import render_md
from events.verify import verify_log

FORMATS = ("json", "md", "html")


class SnapshotError(RuntimeError):
    pass


def build_report(db: Path, window_id: str) -> dict:
    """The report of one window, with the integrity of the whole log it came from."""
    from daemon.cli_log import audit_reader
    with LogReader(db) as reader:
        v = verify_log(reader, read_checkpoint(default_path(db)))
        a = audit_reader(reader)
        integrity = {"events": v.events, "head_seq": v.head_seq, "head_hash": v.head_hash, "chain_ok": v.ok,
                     "audit_ok": a.ok}
        return project(reader.iter_for_projection(window_id, PROJECTED_TYPES), window_id, integrity)


def render(report: dict, fmt: str) -> bytes:
    if fmt == "json":
        return render_json(report)
    if fmt == "md":
        return render_md(report).encode()
    return render_html(report).encode()


def write_reports(db: Path, window_id: str, out: Path) -> dict:
    report = build_report(db, window_id)
    for fmt in FORMATS:
        (out / f"report.{fmt}").write_bytes(render(report, fmt))
    return report


def publish_snapshot(report: dict, root: Path, now_s: float | None = None) -> Path:
    """Writes the report into a new `root/<window>/<UTC date>-<n>/` folder and returns it.

    A snapshot is never overwritten or changed: the folder is claimed with an exclusive mkdir (the
    next free n wins), each file is created exclusively, and the files are left read-only.
    """
    window = report["window_id"]
    if not window or "/" in window or window.startswith("."):
        raise SnapshotError(f"window id {window!r}: not usable as a folder name")
    date = time.strftime("%Y-%m-%d", time.gmtime(time.time() if now_s is None else now_s))
    base = root / window
    base.mkdir(parents=True, exist_ok=True)
    n = 1 + sum(1 for p in base.iterdir() if p.name.startswith(date + "-"))
    while True:
        folder = base / f"{date}-{n}"
        try:
            folder.mkdir()
            break
        except FileExistsError:
            n += 1
    for fmt in FORMATS:
        path = folder / f"report.{fmt}"
        with open(path, "xb") as f:
            f.write(render(report, fmt))
            f.flush()
            os.fsync(f.fileno())
        path.chmod(0o444)
    folder.chmod(0o555)
    return folder
