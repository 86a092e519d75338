"""Building a window's report from a log file and writing it out (json, md, html)."""

from __future__ import annotations

import html
from pathlib import Path

from events.checkpoint import default_path, read_checkpoint
from events.reader import LogReader
from events.report import project, render_json, render_md
from events.verify import verify_log

FORMATS = ("json", "md", "html")


def build_report(db: Path, window_id: str) -> dict:
    """The report of one window, with the integrity of the whole log it came from."""
    from daemon.cli_log import audit_reader
    with LogReader(db) as reader:
        v = verify_log(reader, read_checkpoint(default_path(db)))
        a = audit_reader(reader)
        integrity = {"events": v.events, "head_seq": v.head_seq, "head_hash": v.head_hash, "chain_ok": v.ok,
                     "audit_ok": a.ok}
        return project(reader.iter(window_id=window_id), window_id, integrity)


def render(report: dict, fmt: str) -> bytes:
    if fmt == "json":
        return render_json(report)
    md = render_md(report)
    if fmt == "md":
        return md.encode()
    return ("<!doctype html><meta charset='utf-8'><title>flare-diag report</title>"
            "<style>body{font:14px system-ui;margin:2em;max-width:80em}pre{white-space:pre-wrap}</style>"
            f"<pre>{html.escape(md)}</pre>").encode()


def write_reports(db: Path, window_id: str, out: Path) -> dict:
    report = build_report(db, window_id)
    for fmt in FORMATS:
        (out / f"report.{fmt}").write_bytes(render(report, fmt))
    return report
