"""`flare-diag windows`: a log's windows, each with its outcome, verdict, restoration and report."""

from __future__ import annotations

from pathlib import Path

import msgspec

from flare_diag.events.reader import LogReader
from flare_diag.events.schema import RestorationRecorded, VerdictReached, WindowClosed, WindowOpened

TYPES = ["window_opened", "window_closed", "verdict_reached", "restoration_recorded"]


def list_windows(db: Path) -> list[dict]:
    """In the order the windows opened."""
    rows: dict[str, dict] = {}
    with LogReader(db) as reader:
        for env in reader.iter(types=TYPES):
            ev = env.event()
            if isinstance(ev, WindowOpened):
                rows[ev.window_id] = {"window_id": ev.window_id, "plan": str(ev.plan.get("name", "")), "site": ev.site,
                                      "rehearsal": ev.rehearsal, "opened_wall_ns": env.wall_ns, "outcome": None,
                                      "verdict": None, "restoration_verified": None, "report": None}
                continue
            r = rows.get(env.window_id)
            if r is None:
                continue
            if isinstance(ev, WindowClosed):
                r["outcome"] = ev.outcome
            elif isinstance(ev, VerdictReached):
                r["verdict"] = ev.hypothesis
            elif isinstance(ev, RestorationRecorded):
                r["restoration_verified"] = ev.verified
    for r in rows.values():
        r["report"] = _report_path(db, r["window_id"])
    return list(rows.values())


def _report_path(db: Path, window_id: str) -> str | None:
    """Where the window's report is: beside a foreground run's log, or the daemon's latest snapshot."""
    beside = db.parent / "report.json"
    try:
        if beside.is_file() and msgspec.json.decode(beside.read_bytes()).get("window_id") == window_id:
            return str(beside)
    except (OSError, msgspec.DecodeError, AttributeError):
        pass
    snaps = db.parent / "reports" / window_id
    if snaps.is_dir():
        latest = sorted(snaps.iterdir(), key=lambda p: (p.name.rsplit("-", 1)[0], int(p.name.rsplit("-", 1)[-1])
                                                           if p.name.rsplit("-", 1)[-1].isdigit() else 0))
        if latest:
            return str(latest[-1] / "report.json")
    return None
