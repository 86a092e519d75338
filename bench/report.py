"""Report generation over a 1,000,000-event window vs a bare fold over the same events.

The log is one long synthetic window in the shape the runner writes (per request: the send
decision, its outcome, the scrape decision and outcome, the per-request measurement, a tick), so
the report has ~166,000 request rows, spread over `--phases` cells (48: about the seed plan's cells
with its trace arms; a plan bounds them, the log's length does not). "Report" is the projection,
its request rows, counter series and natural failures rendered into a spool as they are made, plus
the three formats (json, md, html) assembled and written to their files, as `write_reports` does;
"bare fold" reads the same envelopes and decodes every event, which is the least any projection
must do. Integrity (verify, audit) is measured by bench/event_log.py and left out.

The two are run alternately `--rounds` times in the same process and each side's best round is
compared (as timeit does): on a shared machine a single round of either can be stretched by a
neighbour, and the spread of the per-round ratios is printed with it. `--memory` adds one traced
pass of each for its peak Python heap, and this process's peak RSS over every round (the log is
written by a child process, so none of it is the fill's); `--phases 6000` shows what a cell costs (about 14 KB each,
held until the files are written).

Usage: python bench/report.py [--events 1000000] [--rounds 3] [--memory] [--phases 48]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flare_diag.events.fold import fold  # noqa: E402
from flare_diag.events.reader import LogReader  # noqa: E402
from flare_diag.daemon.reports.publish import FORMATS, write_report_files  # noqa: E402
from flare_diag.events.report import PROJECTED_TYPES, UNREAD_ACTIONS, project_window  # noqa: E402
from flare_diag.daemon.reports.report_spool import ReportSpool  # noqa: E402
from flare_diag.events.actions import ScrapeMetrics, SendRequest
from flare_diag.events.schema import (  # noqa: E402
    ActionDone, ActionRequested, CellRecorded, DrainObserved, PhaseStarted, RequestDone, RequestMeasured, Tick,
    TimeMarked, WindowOpened,
)
from flare_diag.events.store import EventStore  # noqa: E402

WINDOW = "bench-window"
BODIES = 52
PHASES = 48  # about the cells of the seed's plan with its trace arms: a plan, not the log, bounds them
COUNTERS = ("host_lookups", "host_hits", "host_fetched_tokens", "host_reused_tokens", "gpu_hits", "gpu_reused_tokens")


def _events(n: int, phases: int = PHASES, time_scale: float = 1.0):
    per_phase = max(1, -(-n // 6 // phases))  # six events a request
    plan = {"name": "bench", "identity": {"image": "47ce7fde", "model": "dec48abd"},
            "timing": {"stop_min": 70, "window_min": 90, "restore_reserve_min": 20}}
    yield WindowOpened(at_ns=0, window_id=WINDOW, plan=plan, plan_sha256="0" * 64, site="bench", gpu_source="sim",
                       rehearsal=True, candidate_recipe="glm-candidate", time_scale=time_scale)
    yield TimeMarked(mark="t0", minute=0.0)
    k, aid, at, phase, emitted = 0, 0, 0, 0, 2
    counters = dict.fromkeys(COUNTERS, 0)
    while emitted < n:
        ph = f"P{phase}.{'forward' if phase % 2 == 0 else 'reverse'}_replay"
        yield PhaseStarted(phase=ph, minute=at / 6e10, estimated_end_minute=at / 6e10 + 15)
        emitted += 1
        for i in range(per_phase):
            aid += 1
            at += 2_000_000_000
            b = i % BODIES
            sha = f"{(b * 2654435761) % 2**32:08x}" * 8
            args = {"phase": ph, "order_index": i, "body_index": b, "body_sha256": sha, "fixture": "c1-52"}
            yield ActionRequested(action_id=aid, request=SendRequest(**args), experimental=True)
            yield RequestDone(at_ns=at, action_id=aid, phase=ph, order_index=i, body_index=b, body_sha256=sha,
                              outcome="ok", finish_reason="length" if i % 13 == 0 else "stop", visible_output=True, prompt_tokens=9000 + i,
                              completion_tokens=700, cached_tokens=4096, first_byte_ns=90_000_000,
                              first_token_ns=120_000_000, last_token_ns=1_900_000_000, end_ns=1_950_000_000,
                              response_bytes=70_000, response_sha256=sha)
            aid += 1
            yield ActionRequested(action_id=aid, request=ScrapeMetrics())
            counters = {c: v + (i + 1) * 17 for c, v in counters.items()}
            yield ActionDone(at_ns=at + 1, action_id=aid, ok=True, data={"counters": counters, "gauges": {}})
            yield RequestMeasured(phase=ph, order_index=i, body_index=b, body_sha256=sha, outcome="ok",
                                  natural_failure="length" if i % 13 == 0 else None, delta={c: (i + 1) * 17 for c in COUNTERS})
            yield Tick(at_ns=at + 2)
            emitted += 6
            if emitted >= n:
                break
        yield DrainObserved(purpose=f"after {ph}", settled=True, waited_s=1.5, polls=3, minute=at / 6e10)
        yield CellRecorded(phase=ph, status="measured", reason=f"{per_phase} requests", requests=per_phase,
                           host={"lookups": 52, "hits": 52, "fetched_tokens": 9, "reused_tokens": 9},
                           gpu={"hits": 1, "reused_tokens": 1})
        emitted += 2
        phase += 1
        k += 1


async def _fill(path: Path, n: int, phases: int = PHASES, time_scale: float = 1.0) -> int:
    store = await EventStore.open(path)
    batch = []
    for ev in _events(n, phases, time_scale):
        batch.append(ev)
        if len(batch) == 50_000:
            store.submit_many(batch, window_id=WINDOW)
            await store.flush()  # committed a batch at a time: the fill's memory stays bounded too
            batch = []
    if batch:
        store.submit_many(batch, window_id=WINDOW)
    await store.flush()
    await store.close()
    return store.head[0]


def _fill_log(path: Path, n: int, phases: int) -> int:
    return asyncio.run(_fill(path, n, phases))


def _bare(r: LogReader) -> tuple[float, int]:
    t0 = time.perf_counter()
    count = fold(r.iter(window_id=WINDOW), 0, lambda s, env: s + (env.event() is not None))
    return time.perf_counter() - t0, count


def _report(r: LogReader, integrity: dict, root: Path) -> tuple[float, list[float], list[int], dict]:
    """What `write_reports` does after verification: one pass over the log projecting the report,
    its request rows, counter series and natural failures rendered into a spool as they are made,
    then the three formats assembled around them, each written to its file. Each round writes new
    files, as a published snapshot is (the last round's are removed after the clock stops)."""
    out = Path(tempfile.mkdtemp(dir=root))
    try:
        return _report_into(r, integrity, out)
    finally:
        shutil.rmtree(out)


def _report_into(r: LogReader, integrity: dict, out: Path) -> tuple[float, list[float], list[int], dict]:
    t0 = time.perf_counter()
    with ReportSpool() as spool:
        rep = project_window(r.iter_for_projection(WINDOW, PROJECTED_TYPES, UNREAD_ACTIONS), WINDOW, integrity, spool)
        times = [time.perf_counter() - t0]
        t0 = time.perf_counter()
        write_report_files(rep, out)
        times.append(time.perf_counter() - t0)
        requests = spool.request_count
    sizes = [(out / f"report.{fmt}").stat().st_size for fmt in FORMATS]
    return sum(times), times, sizes, requests


def _traced_peak(fn) -> float:
    """Peak Python-heap MB while fn runs (tracemalloc; SQLite's own C allocations are not counted)."""
    import tracemalloc
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--phases", type=int, default=PHASES,
                    help="cells the window's requests are spread over (a plan's; default %(default)s)")
    ap.add_argument("--memory", action="store_true", help="also one traced pass of each side for peak memory")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "log.db"
        # the log is written by a child process, so this one's peak RSS is the reading sides' alone
        with ProcessPoolExecutor(1) as pool:
            n = pool.submit(_fill_log, db, a.events, a.phases).result()
        os.sync()  # the fill's write-back is neither side's work: it would land in the first round's clock
        integrity = {"events": n, "head_seq": n, "head_hash": "", "chain_ok": True, "audit_ok": True}
        bares, reports = [], []
        with LogReader(db) as r:
            for _ in range(a.rounds):
                bare, count = _bare(r)
                bares.append(bare)
                total, times, sizes, requests = _report(r, integrity, Path(d))
                reports.append((total, times))
            if a.memory:
                fold_mb = _traced_peak(lambda: _bare(r))
                report_mb = _traced_peak(lambda: _report(r, integrity, Path(d)))
        bare = min(bares)
        total, times = min(reports)
        per_round = [rt / b for (rt, _t), b in zip(reports, bares)]
        print(f"events {count:,}  requests in report {requests:,} over {a.phases:,} cells  outputs json/md/html "
              f"{sizes[0] / 1e6:.0f}/{sizes[1] / 1e6:.0f}/{sizes[2] / 1e6:.0f} MB")
        print(f"best of {a.rounds} rounds: bare fold (read + decode every event) {bare:.2f} s   report (projection "
              f"{times[0]:.2f} s, the request rows rendered into a spool as they are made, + json/md/html "
              f"assembled around them {times[1]:.2f} s) {total:.2f} s")
        print(f"ratio report/fold = {total / bare:.2f}  (goal <= 1.25; per round {', '.join(f'{x:.2f}' for x in per_round)})")
        if a.memory:
            print(f"peak RSS of this process over every round of both sides: "
                  f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (the interpreter and imports included)")
            print(f"peak traced memory: bare fold {fold_mb:.0f} MB   report {report_mb:.0f} MB "
                  f"(goal <= 150 MB; request rows, counters and failures spooled, per-phase sample columns kept)")


if __name__ == "__main__":
    main()
