"""`flare-diag report compare`: windows as repeats, judged by the seed's acceptance rule."""

from __future__ import annotations

import hashlib
import statistics
from pathlib import Path

from flare_diag.daemon.reports.publish import build_reports
from flare_diag.daemon.reports.report_view import integrity_problem
from flare_diag.policies.acceptance import MIN_BENEFIT, Acceptance, Run, accept, acceptance_bar, percent


class CompareError(ValueError):
    pass


def _comparable_requests(report: dict) -> list[dict]:
    measured = {c["phase"] for c in report["cells"] if c["status"] == "measured" and c["comparable"]}
    return [q for q in report.get("requests", []) if q["phase"] in measured]


def run_of(report: dict) -> Run:
    """One window as one repeat.

    fixed bytes: the SHA-256 over the sorted body hashes it replayed in comparable measured cells;
    correct: completed, restore verified, log intact, every one of those requests answered, and every
    output-consistency phase consistent (a cached state changed no answer);
    primary: median time to first token (ms, lower is better);
    protected: p95 end-to-end latency and median decode time per completion token (ms, lower is better).
    """
    reqs = _comparable_requests(report)
    bodies = sorted({q["body_sha256"] for q in reqs})
    fixed = hashlib.sha256("\n".join(bodies).encode()).hexdigest()
    ok = [q for q in reqs if q["outcome"] == "ok"]
    it = report["integrity"]
    checks = [
        (report.get("outcome") == "completed", f"window outcome {report.get('outcome')}"),
        (bool((report.get("restoration") or {}).get("verified")), "restoration not verified"),
        (bool(it.get("chain_ok") and it.get("audit_ok")),
         "the log does not verify" if integrity_problem(it) else
         "its decisions were made by another policy version and not audited by this build"),
        (bool(reqs) and len(ok) == len(reqs), f"{len(reqs) - len(ok)} of {len(reqs)} comparable requests not answered"),
    ]
    for c in report["cells"]:
        res = c.get("consistency")
        if res is not None:  # cached state must not change an answer (output consistency)
            checks.append((bool(res.get("consistent")) and not res["differ"],
                           f"outputs changed under reuse in {c['phase']} ({len(res['differ'])} of {res['compared']} "
                           f"greedy bodies)" if res["differ"] else f"{c['phase']}: no answers compared"))
    failed = [why for good, why in checks if not good]
    correct = not failed
    ttft = [q["first_token_ns"] / 1e6 for q in ok if q.get("first_token_ns") is not None]
    ends = sorted(q["end_ns"] / 1e6 for q in ok if q.get("end_ns") is not None)
    per_tok = [(q["end_ns"] - q["first_token_ns"]) / 1e6 / q["completion_tokens"] for q in ok
               if q.get("end_ns") is not None and q.get("first_token_ns") is not None and q.get("completion_tokens")]
    return Run(fixture_sha256=fixed, correct=correct, incorrect="; ".join(failed),
               primary=statistics.median(ttft) if ttft else float("inf"),
               protected={"p95_end_to_end_ms": ends[int(0.95 * (len(ends) - 1))] if ends else float("inf"),
                          "decode_ms_per_token": statistics.median(per_tok) if per_tok else float("inf")})


# what repeats must share to be compared: within a side all of it; across the sides all but the plan's
# name and the build (the candidate policy is another build: its image, commit and package differ)
BUILD_FIELDS = ("image", "flare_commit", "package")


def _matched_features(db: Path, window_id: str, report: dict) -> dict:
    """What makes two windows repeats of one experiment, read from the window's own log."""
    from flare_diag.events.reader import LogReader
    from flare_diag.events.schema import WindowOpened
    with LogReader(db) as r:
        opened = next((e.event() for e in r.iter_for_projection(window_id, {"window_opened"})), None)
    if not isinstance(opened, WindowOpened):
        raise CompareError(f"{db}: window {window_id} has no opening event")
    plan = opened.plan
    replays = [ph for ph in plan.get("phases", []) if ph.get("kind") == "replay" and ph.get("comparable", True)]
    return {
        "plan": plan.get("name"),
        "fixtures": {"bytes": run_of(report).fixture_sha256, "files": dict(sorted(opened.fixtures_sha256.items()))},
        "concurrency": sorted({ph.get("concurrency", 1) for ph in replays}),
        "sampling": plan.get("sampling"),
        "order": [[ph["id"], ph.get("fixture"), ph.get("order", "forward"), ph.get("select_last"), ph.get("passes", 1)]
                  for ph in replays],
        "site": opened.site,
        "identity": plan.get("identity"),
        "acceptance": acceptance_bar(plan),
    }


def _unmatched(features: dict[str, dict], side: list[str], other: list[str]) -> str | None:
    """The first field in which the repeats differ, named with the two windows, or None."""
    def differs(a: str, b: str, field: str) -> bool:
        fa, fb = features[a][field], features[b][field]
        if field == "identity" and (a in side) != (b in side):
            fa = {k: v for k, v in (fa or {}).items() if k not in BUILD_FIELDS}
            fb = {k: v for k, v in (fb or {}).items() if k not in BUILD_FIELDS}
        return fa != fb
    first = side[0]
    for field in ("fixtures", "concurrency", "sampling", "order", "site", "identity", "acceptance", "plan"):
        for w in side[1:] + (other if field != "plan" else []):
            if differs(first, w, field):
                return (f"repeats are not matched: {field} differs between window {first} and window {w}: "
                        + _difference(features[first][field], features[w][field]))
    return None


def _difference(a, b) -> str:
    """What differs, briefly: the keys of two mappings that differ (nested once), else both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        parts = []
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k) != b.get(k):
                inner = _difference(a.get(k), b.get(k)) if isinstance(a.get(k), dict) and isinstance(b.get(k), dict) \
                    else f"{_short(a.get(k))} vs {_short(b.get(k))}"
                parts.append(f"{k} {inner}")
        return "; ".join(parts[:3])
    return f"{_short(a)} vs {_short(b)}"


def _short(v) -> str:
    s = str(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _samples(report: dict) -> dict[str, list[float]]:
    ok = [q for q in _comparable_requests(report) if q["outcome"] == "ok"]
    return {
        "median_ttft_ms": [q["first_token_ns"] / 1e6 for q in ok if q.get("first_token_ns") is not None],
        "p95_end_to_end_ms": [q["end_ns"] / 1e6 for q in ok if q.get("end_ns") is not None],
        "decode_ms_per_token": [(q["end_ns"] - q["first_token_ns"]) / 1e6 / q["completion_tokens"] for q in ok
                                if q.get("end_ns") is not None and q.get("first_token_ns") is not None
                                and q.get("completion_tokens")],
    }


def window_refs(db: Path | None, given: list[str]) -> dict[str, Path]:
    """Each repeat as (window id -> its log): a window id in `db`, or the path of another window's
    log (a log.db, or the out folder holding one) whose log holds that one window."""
    from flare_diag.events.reader import LogReader
    known: dict[Path, list[str]] = {}

    def ids(path: Path) -> list[str]:
        if path not in known:
            with LogReader(path) as r:
                known[path] = list(r.window_ids())
        return known[path]

    out: dict[str, Path] = {}
    for g in given:
        p = Path(g)
        log = p / "log.db" if p.is_dir() else p
        if log.is_file() and (p.is_dir() or p.suffix == ".db" or db is None):
            found = ids(log)
            if len(found) != 1:
                raise CompareError(f"{g}: its log holds {len(found)} windows; give the log and the window ids instead")
            wid = found[0]
        elif db is not None and g in ids(db):
            wid, log = g, db
        else:
            raise CompareError(f"{g}: no such window in {db}" if db is not None else
                               f"{g}: neither a window's log nor its out folder")
        if wid in out:
            raise CompareError(f"window {wid} is given twice")
        out[wid] = log
    return out


def compare(db: Path | None, windows: list[str], baseline: list[str], repeats: int = 3
            ) -> tuple[Acceptance, dict[str, Run], list]:
    """The acceptance rule over exactly `repeats` matched windows a side, and the statistics beside it.
    Each window is an id in `db` or the path of its own log; the runs come back keyed by window id."""
    from flare_diag.events.stats import compare_repeats, p95
    for name, side in (("--windows", windows), ("--baseline", baseline)):
        if len(side) > repeats:
            raise CompareError(f"{name}: {len(side)} windows; the rule uses exactly {repeats} repeats a side "
                               f"(--repeats {repeats}), none averaged away")
    cand, base = window_refs(db, windows), window_refs(db, baseline)
    logs = {**cand, **base}
    windows, baseline = list(cand), list(base)
    both = set(windows) & set(baseline)
    if both:
        raise CompareError(f"window {sorted(both)[0]} is given as both a candidate and a baseline repeat")
    order = list(dict.fromkeys((*windows, *baseline)))
    by_log: dict[Path, list[str]] = {}
    for w in order:
        by_log.setdefault(logs[w], []).append(w)
    # a log's integrity (its chain, every window's decisions replayed) is established once, not per window
    built = {w: rep for log, ws in by_log.items() for w, rep in build_reports(log, ws).items()}
    reports = {w: built[w] for w in order}
    features = {w: _matched_features(logs[w], w, rep) for w, rep in reports.items()}
    for side, other in ((list(windows), list(baseline)), (list(baseline), list(windows))):
        if side:
            problem = _unmatched(features, side, other)
            if problem:
                raise CompareError(problem)
    runs = {w: run_of(rep) for w, rep in reports.items()}
    verdict = accept([runs[w] for w in windows], [runs[w] for w in baseline], repeats=repeats,
                     **features[order[0]]["acceptance"])
    # the statistics are of the figure the rule decides on: each side's mean of its windows' own figures
    per_window: dict[str, dict[str, list[list[float]]]] = {"candidate": {}, "baseline": {}}
    sides: list[tuple[str, list[str]]] = [("candidate", windows), ("baseline", baseline)]
    for label, ws in sides:
        for w in ws:
            for metric, xs in _samples(reports[w]).items():
                per_window[label].setdefault(metric, []).append(xs)
    stats = []
    for metric, stat in (("median_ttft_ms", statistics.median), ("p95_end_to_end_ms", p95),
                         ("decode_ms_per_token", statistics.median)):
        s = compare_repeats(metric, per_window["baseline"].get(metric, []), per_window["candidate"].get(metric, []), stat)
        if s is not None:
            stats.append(s)
    return verdict, runs, stats


def noise_line(s, min_benefit: float = MIN_BENEFIT) -> str:
    """One line per metric: the change, its interval, the test, and what they say about noise
    (`min_benefit`: the bar the verdict was judged against)."""
    what = "benefit" if s.metric == "median_ttft_ms" else "change"
    # the figure the rule decided on, to the same decimal as its reason, and its interval
    line = (f"{s.metric}: baseline {s.baseline:.1f}, candidate {s.candidate:.1f} (means of the repeats' own): "
            f"{what} {s.change:+.1%} (95% bootstrap interval {s.interval[0]:+.1%} to {s.interval[1]:+.1%}, requests "
            f"resampled within each repeat; Mann-Whitney p = {s.mann_whitney_p:.3g}; {s.n_baseline} and "
            f"{s.n_candidate} requests): ")
    line += "noise could explain it" if s.noise_could_explain else "not explained by noise"
    if s.metric == "median_ttft_ms" and s.interval[0] < min_benefit <= s.interval[1]:
        line += f"; the interval crosses the {percent(min_benefit)} bar"
    return line
