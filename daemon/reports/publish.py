"""Building a window's report from a log file, rendering it, and publishing dated snapshots."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from flare_diag.policies.audit import audit
from flare_diag.events.checkpoint import BadCheckpoint, default_path, read_checkpoint
from flare_diag.events.reader import LogReader
from flare_diag.events.report import PROJECTED_TYPES, json_chunks, project, text_chunks
from flare_diag.events.report_html import html_segments
from flare_diag.events.report_md import md_lines
from flare_diag.events.report_view import request_rows
from flare_diag.events.verify import verify_log

FORMATS = ("json", "md", "html")


class SnapshotError(RuntimeError):
    pass


def audit_log(reader: LogReader):
    """The policy replayed over every window of a log, decision by decision (policies/audit.py)."""
    return audit((env.seq, env.window_id, env.event()) for env in reader.iter())


def build_report(db: Path, window_id: str) -> dict:
    """The report of one window, with the integrity of the whole log it came from."""
    with LogReader(db) as reader:
        try:
            cp = read_checkpoint(default_path(db))
            v = verify_log(reader, cp)
            problem = v.problem
        except BadCheckpoint as exc:
            v, problem = verify_log(reader), str(exc)
        a = audit_log(reader)
        integrity = {"events": v.events, "head_seq": v.head_seq, "head_hash": v.head_hash,
                     "chain_ok": v.ok and problem is None, "audit_ok": a.ok}
        if problem:
            integrity["problem"] = problem
        if not a.ok and a.divergence is not None:
            d = a.divergence
            integrity["audit_problem"] = f"seq {d.seq} (window {d.window_id}): expected {d.expected}, found {d.found}"
        return project(reader.iter_for_projection(window_id, PROJECTED_TYPES), window_id, integrity)


def render_chunks(report: dict, fmt: str, rows: list[tuple[str, ...]] | None = None) -> Iterable[bytes]:
    """A report in one format as pieces a file can take one at a time: a long window's request
    tables are tens of MB that need never be one buffer. `rows` (request_rows of the report),
    when given, spares the md and html tables formatting every request again."""
    if fmt == "json":
        return json_chunks(report)
    return text_chunks(md_lines(report, rows) if fmt == "md" else html_segments(report, rows))


def render(report: dict, fmt: str) -> bytes:
    return b"".join(render_chunks(report, fmt))


def write_report_files(report: dict, out: Path) -> None:
    rows = request_rows(report)
    for fmt in FORMATS:
        with open(out / f"report.{fmt}", "wb") as f:
            f.writelines(render_chunks(report, fmt, rows))


def write_reports(db: Path, window_id: str, out: Path) -> dict:
    report = build_report(db, window_id)
    write_report_files(report, out)
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
    rows = request_rows(report)
    for fmt in FORMATS:
        path = folder / f"report.{fmt}"
        with open(path, "xb") as f:
            f.writelines(render_chunks(report, fmt, rows))
            f.flush()
            os.fsync(f.fileno())
        path.chmod(0o444)
    folder.chmod(0o555)
    return folder
