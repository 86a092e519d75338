"""Recorded reviews of a plan's bytes: what one covers, reading them from a log, signing one, the gate.

A review is an event (`review_signed`) in an event log: the daemon's own (signed over its socket), or
one an operator keeps for foreground `run`s (`review sign --log DB`); either way chained and audited
like every other event. `review sign --export` also writes the review beside the plan as a small file
that names the log, the seq and the event's hash, so that anyone holding that log can check it.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path

from flare_diag.daemon.hosts.fixture import Fixture
from flare_diag.events.base import decode_as
from flare_diag.events.schema import ReviewSigned
from flare_diag.policies.review import Review, accepting


class ReviewError(ValueError):
    """No review lets this plan run; the message says why, in one line."""


def subject(plan_raw: bytes, fixtures: dict[str, Fixture]) -> tuple[str, dict[str, str]]:
    """What a review of this plan covers: its bytes' sha256, and each fixture's manifest sha256."""
    return hashlib.sha256(plan_raw).hexdigest(), {n: f.manifest_sha256 for n, f in sorted(fixtures.items())}


def reviews_in(db: Path) -> list[Review]:
    """Every review a log records, in order; [] for a log with none. Raises ReviewError for no log."""
    if not db.is_file():
        raise ReviewError(f"{db}: no such review log")
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            rows = conn.execute("SELECT seq, hash, schema_v, payload FROM events WHERE type = 'review_signed' "
                                "ORDER BY seq").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise ReviewError(f"{db}: cannot read reviews ({exc})") from None
    out = []
    for seq, h, v, payload in rows:
        ev = decode_as(ReviewSigned, v, payload)
        out.append(Review(ev.plan_sha256, dict(ev.fixtures), ev.by, ev.note, seq, bytes(h).hex(), ev.subject,
                          ev.source_window, ev.policy))
    return out


def gate(plan_raw: bytes, author: str, fixtures: dict[str, Fixture], reviews: list[Review], where: str) -> Review:
    """The review that lets this production plan run, or ReviewError saying why none does."""
    plan_sha, manifests = subject(plan_raw, fixtures)
    review, why = accepting(reviews, plan_sha, manifests, author)
    if review is None:
        raise ReviewError(f"a production plan runs only after someone other than its author reviewed its exact bytes: "
                          f"{why} in {where} (`flare-diag review sign PLAN --by NAME`)")
    return review


def export(plan_path: Path, review: dict, seq: int, event_hash: str, log: str) -> Path:
    """The review beside the plan, naming where it is recorded: `PLAN.review-BY.json`."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", review["by"]).strip("-")[:64] or "reviewer"
    out = plan_path.with_name(f"{plan_path.name}.review-{slug}.json")
    out.write_text(json.dumps({**review, "log": log, "seq": seq, "event_sha256": event_hash}, indent=2) + "\n")
    return out
