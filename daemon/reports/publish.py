"""Building a window's report from a log file, rendering it, and publishing dated snapshots."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from flare_diag.policies.audit import audit
from flare_diag.events.checkpoint import BadCheckpoint, default_path, read_checkpoint
from flare_diag.events.reader import LogReader
from flare_diag.events.report import (
    PROJECTED_TYPES, REQUEST_TYPES, iter_requests, json_chunks, project_window, text_chunks,
)
from flare_diag.events.report_html import html_segments
from flare_diag.events.report_md import md_lines
from flare_diag.events.report_view import REQUEST_COLUMNS, request_columns, request_row, request_rows, scale_of
from flare_diag.events.verify import verify_log

FORMATS = ("json", "md", "html")


class SnapshotError(RuntimeError):
    pass


def audit_log(reader: LogReader):
    """The policy replayed over every window of a log, decision by decision (policies/audit.py)."""
    return audit((env.seq, env.window_id, env.event()) for env in reader.iter())


def build_report(db: Path, window_id: str) -> dict:
    """The report of one window, with the integrity of the whole log it came from."""
    return _built(db, window_id, True)[0]


def _built(db: Path, window_id: str, keep_requests: bool) -> tuple[dict, int | None]:
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
        return project_window(reader.iter_for_projection(window_id, PROJECTED_TYPES), window_id, integrity,
                              keep_requests)


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


def _streams(reader: LogReader, report: dict, t0_ns: int | None) -> dict[str, Iterator[bytes]]:
    """Each format's bytes for a report projected without its request rows, the rows read once more
    from the log, one pass shared by the three formats (tee'd: the writers advance in turn, so only
    a few thousand rows are ever held between them)."""
    window_id = report["window_id"]
    reqs = iter_requests(reader.iter_for_projection(window_id, REQUEST_TYPES), window_id, t0_ns)
    for_json, for_rows = itertools.tee(reqs, 2)
    scale, wall = scale_of(report), len(request_columns(report)) != len(REQUEST_COLUMNS)
    for_md, for_html = itertools.tee((request_row(q, scale, wall) for q in for_rows), 2)
    taken = {fmt: _Counted(it) for fmt, it in (("json", for_json), ("md", for_md), ("html", for_html))}
    return {"json": (json_chunks(report, taken["json"]), taken["json"]),
            "md": (text_chunks(md_lines(report, taken["md"])), taken["md"]),
            "html": (text_chunks(html_segments(report, taken["html"])), taken["html"])}


class _Counted:
    """An iterator that counts what was taken from it."""

    def __init__(self, it) -> None:
        self.it, self.n = it, 0

    def __iter__(self):
        return self

    def __next__(self):
        x = next(self.it)
        self.n += 1
        return x


def write_streamed(db: Path, report: dict, t0_ns: int | None, files: dict[str, BinaryIO]) -> None:
    """Writes the three formats into `files` (by format), always advancing the writer that has taken
    the fewest rows, so the rows tee'd between them stay within a chunk of each other."""
    with LogReader(db) as reader:
        live = _streams(reader, report, t0_ns)
        while live:
            fmt = min(live, key=lambda k: live[k][1].n)
            chunk = next(live[fmt][0], None)
            if chunk is None:
                del live[fmt]
            else:
                files[fmt].write(chunk)


def write_reports(db: Path, window_id: str, out: Path) -> dict:
    """Writes report.json, .md and .html of a window into `out`, streaming its request rows from the
    log; returns the report without them (the files have them)."""
    report, t0_ns = _built(db, window_id, keep_requests=False)
    with contextlib.ExitStack() as stack:
        files = {fmt: stack.enter_context(open(out / f"report.{fmt}", "wb")) for fmt in FORMATS}
        write_streamed(db, report, t0_ns, files)
    return report


def publish_window(db: Path, window_id: str, root: Path) -> tuple[dict, Path]:
    """A closed window's report as a new snapshot (publish_snapshot), its request rows streamed from
    the log: the daemon's memory does not grow with the window. Returns the report without its rows."""
    report, t0_ns = _built(db, window_id, keep_requests=False)
    return report, publish_snapshot(report, root, write=lambda files: write_streamed(db, report, t0_ns, files))


def publish_snapshot(report: dict, root: Path, now_s: float | None = None,
                     write: Callable[[dict[str, BinaryIO]], None] | None = None) -> Path:
    """Writes the report into a new `root/<window>/<UTC date>-<n>/` folder and returns it.

    A snapshot is never overwritten or changed: the folder is claimed with an exclusive mkdir (the
    next free n wins), each file is created exclusively, and the files are left read-only.
    `write`: writes the three formats into their files (streamed from the log), in place of rendering
    `report` here.
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
    with contextlib.ExitStack() as stack:
        files = {fmt: stack.enter_context(open(folder / f"report.{fmt}", "xb")) for fmt in FORMATS}
        if write is None:
            rows = request_rows(report)
            for fmt in FORMATS:
                files[fmt].writelines(render_chunks(report, fmt, rows))
        else:
            write(files)
        for f in files.values():
            f.flush()
            os.fsync(f.fileno())
    for fmt in FORMATS:
        (folder / f"report.{fmt}").chmod(0o444)
    folder.chmod(0o555)
    return folder
