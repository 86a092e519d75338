"""Building a window's report from a log file, rendering it, and publishing dated snapshots."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from flare_diag.policies.audit import AuditResult, NotReplayed, audit
from flare_diag.events.checkpoint import BadCheckpoint, default_path, read_checkpoint
from flare_diag.events.reader import LogReader
from flare_diag.events.report import PROJECTED_TYPES, UNREAD_ACTIONS, json_chunks, project_window, text_chunks
from flare_diag.daemon.reports.report_html import html_segments
from flare_diag.daemon.reports.report_md import md_lines
from flare_diag.daemon.reports.report_spool import ReportSpool
from flare_diag.daemon.reports.report_view import request_rows
from flare_diag.events.verify import verify_log
from flare_diag.daemon.window.setup import policy_version

FORMATS = ("json", "md", "html")


class SnapshotError(RuntimeError):
    pass


def audit_log(reader: LogReader) -> AuditResult:
    """The policy replayed over every window of a log, decision by decision (policies/audit.py); a
    window decided by another version of the policy, which this build decides differently, is
    `not_replayed` rather than diverged."""
    return audit(((env.seq, env.window_id, env.event()) for env in reader.iter()), policy_version())


def not_replayed_words(x: NotReplayed) -> str:
    """Why a window's decisions were not audited here, in one line."""
    d = x.at
    made = f"policy {x.policy_sha256[:12]}" if x.policy_sha256 else "a policy whose version the log does not record"
    return (f"window {x.window_id} was decided by {made}; this build's policy ({policy_version()[:12]}) decides "
            f"differently from seq {d.seq:,} (this build: {d.expected}; the log: {d.found}): audit it with the "
            f"flare-diag that made it")


def build_report(db: Path, window_id: str) -> dict:
    """The report of one window, with the integrity of the whole log it came from (every request
    row in memory: for a window's consumers in process; files are written with `write_reports`)."""
    with LogReader(db) as reader:
        return _project(reader, window_id)


def build_reports(db: Path, window_ids: Iterable[str]) -> dict[str, dict]:
    """The reports of several windows of one log, as `build_report` makes each: the log's integrity
    (its chain verified and every window's decisions replayed) is established once for all of them."""
    with LogReader(db) as reader:
        integrity = _integrity(reader)
        return {w: _project(reader, w, integrity=integrity) for w in window_ids}


def _project(reader: LogReader, window_id: str, spool: ReportSpool | None = None,
             integrity: tuple[dict, AuditResult] | None = None) -> dict:
    """The window's report (its rows in `spool` when one is given), with the integrity of the log."""
    chain, audited = _integrity(reader) if integrity is None else integrity
    return project_window(reader.iter_for_projection(window_id, PROJECTED_TYPES, UNREAD_ACTIONS), window_id,
                          window_integrity(chain, audited, window_id), spool)


def _integrity(reader: LogReader) -> tuple[dict, AuditResult]:
    """(the log's chain, verified against its checkpoint; its decisions, replayed): once per log."""
    try:
        cp = read_checkpoint(default_path(reader.path))
        v = verify_log(reader, cp)
        problem = v.problem
    except BadCheckpoint as exc:
        v, problem = verify_log(reader), str(exc)
    chain = {"events": v.events, "head_seq": v.head_seq, "head_hash": v.head_hash, "chain_ok": v.ok and problem is None}
    if problem:
        chain["problem"] = problem
    return chain, audit_log(reader)


def integrity_of(reader: LogReader, window_id: str) -> dict:
    """The integrity a report of `window_id` from this log carries."""
    return window_integrity(*_integrity(reader), window_id)


def window_integrity(chain: dict, audited: AuditResult, window_id: str) -> dict:
    """A report's integrity: the log's chain, and `audit_ok` when this window's decisions replayed equal
    and no decision of the log diverged under the policy that made it. A window decided by another
    policy version that this build decides differently says so (`audit_policy`), and is not audited."""
    mine = next((x for x in audited.not_replayed if x.window_id == window_id), None)
    d = audited.divergence
    out = {"events": chain["events"], "head_seq": chain["head_seq"], "head_hash": chain["head_hash"],
           "chain_ok": chain["chain_ok"], "audit_ok": d is None and mine is None}
    if "problem" in chain:
        out["problem"] = chain["problem"]
    if d is not None:
        out["audit_problem"] = f"seq {d.seq} (window {d.window_id}): expected {d.expected}, found {d.found}"
    if mine is not None:
        out["audit_policy"] = not_replayed_words(mine)
    return out


@contextlib.contextmanager
def spooled_report(db: Path, window_id: str) -> Iterator[dict]:
    """The report of one window projected in one pass with its per-request parts in a spool
    (daemon/reports/report_spool.py): render it while the context is open, then the spool's files go."""
    with ReportSpool() as spool, LogReader(db) as reader:
        yield _project(reader, window_id, spool)


def render_chunks(report: dict, fmt: str, rows: list[tuple[str, ...]] | None = None) -> Iterable[bytes]:
    """A report in one format as pieces a file can take one at a time: a long window's request
    tables are tens of MB that need never be one buffer. `rows` (request_rows of the report),
    when given, spares the md and html tables formatting every request again."""
    if fmt == "json":
        return json_chunks(report)
    return text_chunks(md_lines(report, rows) if fmt == "md" else html_segments(report, rows))


def render(report: dict, fmt: str) -> bytes:
    return b"".join(render_chunks(report, fmt))


def _rows(report: dict) -> list[tuple[str, ...]] | None:
    """The request rows' cells, made once for md and html; None for a spooled report (its own)."""
    return None if getattr(report, "spool", None) is not None else request_rows(report)


def write_report_files(report: dict, out: Path) -> None:
    rows = _rows(report)
    for fmt in FORMATS:
        with open(out / f"report.{fmt}", "wb") as f:
            f.writelines(render_chunks(report, fmt, rows))


def write_reports(db: Path, window_id: str, out: Path) -> dict:
    """Writes report.json, .md and .html of a window into `out` from one pass over its log, the
    request rows spooled on the way; returns the report without them (the files have them)."""
    with spooled_report(db, window_id) as report:
        write_report_files(report, out)
    return report


def publish_window(db: Path, window_id: str, root: Path) -> tuple[dict, Path]:
    """A closed window's report as a new snapshot (publish_snapshot), projected in one pass with its
    request rows spooled: the daemon's memory does not grow with the window. Returns the report
    without its rows."""
    with spooled_report(db, window_id) as report:
        return report, publish_snapshot(report, root)


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
    with contextlib.ExitStack() as stack:
        files = {fmt: stack.enter_context(open(folder / f"report.{fmt}", "xb")) for fmt in FORMATS}
        rows = _rows(report)
        for fmt in FORMATS:
            files[fmt].writelines(render_chunks(report, fmt, rows))
        for f in files.values():
            f.flush()
            os.fsync(f.fileno())
    for fmt in FORMATS:
        (folder / f"report.{fmt}").chmod(0o444)
    folder.chmod(0o555)
    return folder
