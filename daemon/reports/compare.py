"""`flare-diag report compare`: windows as repeats, judged by the seed's acceptance rule."""

from __future__ import annotations

import hashlib
import statistics
from pathlib import Path

from flare_diag.daemon.reports.publish import build_report
from flare_diag.policies.acceptance import Acceptance, Run, accept


class CompareError(ValueError):
    pass


def _comparable_requests(report: dict) -> list[dict]:
    measured = {c["phase"] for c in report["cells"] if c["status"] == "measured" and c["comparable"]}
    return [q for q in report.get("requests", []) if q["phase"] in measured]


def run_of(report: dict) -> Run:
    """One window as one repeat.

    fixed bytes: the SHA-256 over the sorted body hashes it replayed in comparable measured cells;
    correct: completed, restore verified, log intact, and every one of those requests answered;
    primary: median time to first token (ms, lower is better);
    protected: p95 end-to-end latency and median decode time per completion token (ms, lower is better).
    """
    reqs = _comparable_requests(report)
    bodies = sorted({q["body_sha256"] for q in reqs})
    fixed = hashlib.sha256("\n".join(bodies).encode()).hexdigest()
    ok = [q for q in reqs if q["outcome"] == "ok"]
    it = report["integrity"]
    correct = bool(report.get("outcome") == "completed" and (report.get("restoration") or {}).get("verified")
                   and it.get("chain_ok") and it.get("audit_ok") and reqs and len(ok) == len(reqs))
    ttft = [q["first_token_ns"] / 1e6 for q in ok if q.get("first_token_ns") is not None]
    ends = sorted(q["end_ns"] / 1e6 for q in ok if q.get("end_ns") is not None)
    per_tok = [(q["end_ns"] - q["first_token_ns"]) / 1e6 / q["completion_tokens"] for q in ok
               if q.get("end_ns") is not None and q.get("first_token_ns") is not None and q.get("completion_tokens")]
    return Run(fixture_sha256=fixed, correct=correct, primary=statistics.median(ttft) if ttft else float("inf"),
               protected={"p95_end_to_end_ms": ends[int(0.95 * (len(ends) - 1))] if ends else float("inf"),
                          "decode_ms_per_token": statistics.median(per_tok) if per_tok else float("inf")})


def compare(db: Path, windows: list[str], baseline: list[str]) -> tuple[Acceptance, dict[str, Run]]:
    from flare_diag.events.reader import LogReader
    with LogReader(db) as r:
        known = set(r.window_ids())
    missing = [w for w in (*windows, *baseline) if w not in known]
    if missing:
        raise CompareError(f"{db}: no window {missing[0]!r} in this log")
    runs = {w: run_of(build_report(db, w)) for w in dict.fromkeys((*windows, *baseline))}
    return accept([runs[w] for w in windows], [runs[w] for w in baseline]), runs
