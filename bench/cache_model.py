"""The host-cache model at scale, measured side by side in one run:

1. the 100,000-request trace drawn from the 52-body fixture (zipf-like reuse), through the model
   as it is and through the model as it was before issue 17 (c462be7's cache.py, whose victim and
   compaction choices scanned every record), with the ratio of their times and a check that both
   made the same choices;
2. Mooncake's conversation trace (12,031 requests, ../shared/traces/mooncake/; where that is not
   checked out beside the repository, the first 1,000 that tests/data/mooncake carries) under each
   eviction policy and the block-level LRU baseline, and (1b) through both models side by side;
3. a 1,000,000-request synthetic trace of the same shape (goal: under 45 s, issue 30), and its 100,000-request
   prefix, with each run's peak resident memory (a fresh process per run): bounded by the cache,
   the two peaks should be close.

Usage: python bench/cache_model.py [--requests 100000] [--synthetic 1000000] [--capacity-blocks 8192]
                                  [--mooncake N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import random
import resource
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flare_diag.fixtures.flaresim.engine import Incarnation  # noqa: E402
from flare_diag.fixtures.flaresim.scenario import load_scenario  # noqa: E402

DATA = ROOT / "fixtures" / "data" / "c1-52"
# the whole trace where the shared traces are checked out beside the repository; else the first 1,000
# requests that the tests carry (tests/data/mooncake), so that the side-by-side checks run anywhere
WHOLE_MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
MOONCAKE = WHOLE_MOONCAKE if WHOLE_MOONCAKE.is_file() else ROOT / "tests" / "data" / "mooncake" / "conversation-1000.jsonl"
BEFORE = "c462be7"  # the last commit before issue 17's O(log n) eviction


def _old_cache_class():
    """HostCache as it was at BEFORE, loaded from git (None where git or that commit is missing)."""
    try:
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:fixtures/flaresim/cache.py"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    # The one thing the earlier model reads that sequences no longer carry: a trace's BlockSeq keeps its
    # length, not its tokens. Everything else it runs as it was.
    if "len(seq.tokens)" not in src:
        raise RuntimeError(f"the model at {BEFORE} no longer reads len(seq.tokens): adapt _old_cache_class")
    src = src.replace("len(seq.tokens)", "seq.length")
    mod = types.ModuleType("cache_before_issue_17")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(src, "cache_before_issue_17.py", "exec"), mod.__dict__)

    class Before(mod.HostCache):
        def store(self, kind, seq, pos, pinned=False):
            # today's drivers pin a full prompt's record as it is made; the earlier model pinned it
            # just after, which is the same thing
            cp = super().store(kind, seq, pos)
            if pinned:
                self.pin([cp], +1)
            return cp

    return Before


def _fixture_trace(n: int):
    bodies = [ln.rstrip(b"\n") for ln in (DATA / "bodies.jsonl").open("rb")]
    parsed = [json.loads(b) for b in bodies]
    rng = random.Random(7)
    return bodies, parsed, [min(int(rng.paretovariate(1.2)) - 1, 51) for _ in range(n)]


def fixture_trace_run(n: int, model: str) -> tuple[float, dict]:
    sc = load_scenario("flare-47581cca")
    bodies, parsed, trace = _fixture_trace(n)
    warm = Incarnation(sc, "warm", "r", "s")
    for i in range(52):  # tokenize and block-hash every body once (cached per body), outside the timed part
        warm.run_inline(bodies[i], parsed[i])
    inc = Incarnation(sc, "bench", "r", "s")
    if model == "before":
        inc.cache = _old_cache_class()(sc)
    t0 = time.perf_counter()
    for i in trace:
        inc.run_inline(bodies[i], parsed[i])
    dt = time.perf_counter() - t0
    c = inc.cache.c
    return dt, {"reused": c.reused_tokens, "evictions": dict(c.evictions), "compactions": c.compactions}


def trace_run(kind: str, n: int | None, policy: str, capacity: int) -> tuple[float, dict]:
    import msgspec

    from flare_diag.daemon.reproducer.reproduce import rows_for
    from flare_diag.fixtures.flaresim.trace import read_trace, run_block_lru, run_host_cache, synthetic_trace
    sc = msgspec.structs.replace(load_scenario("flare-47581cca"), eviction=policy if policy != "block_lru" else "lru_leaf")
    reqs = read_trace(MOONCAKE, n) if kind == "mooncake" else synthetic_trace(n or 0)
    t0 = time.perf_counter()
    if policy == "block_lru":
        st = run_block_lru(reqs, capacity)
        extra = {}
    else:
        cache, st = run_host_cache(reqs, sc, rows_for(sc, capacity), capacity)
        extra = {"evictions": dict(cache.c.evictions), "compactions": cache.c.compactions}
    return time.perf_counter() - t0, {"requests": st.requests, "reused": st.reused_tokens,
                                      "share": st.reused_tokens / max(st.input_tokens, 1), **extra}


def mooncake_before_and_now(model: str, rows: int, pages: int, n: int | None) -> tuple[float, dict]:
    """The Mooncake trace on a cache with many rows, where scanning every record per choice costs."""
    import msgspec

    from flare_diag.fixtures.flaresim.trace import read_trace, run_host_cache, trace_scenario
    base = trace_scenario(load_scenario("flare-47581cca"))
    cache = None
    if model == "before":  # the earlier model sizes its pools from the scenario alone
        sc = msgspec.structs.replace(base, rows_capacity=rows, host_cache_bytes=rows * base.row_bytes + pages * base.page_bytes)
        cache = _old_cache_class()(sc)
    t0 = time.perf_counter()
    cache, st = run_host_cache(read_trace(MOONCAKE, n), base, rows, pages, cache=cache)
    return time.perf_counter() - t0, {"reused": st.reused_tokens, "evictions": dict(cache.c.evictions),
                                      "compactions": cache.c.compactions}


def _child(q, fn, args):
    try:
        out = fn(*args)
    except BaseException as e:  # the parent says what failed instead of waiting for a result that never comes
        q.put(("error", f"{type(e).__name__}: {e}"))
        raise
    q.put(("ok", (*out, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)))


def in_fresh_process(fn, *args):
    """(seconds, result, peak RSS in MiB) of fn(*args) run alone in a new interpreter."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q, fn, args))
    p.start()
    while True:
        try:
            kind, res = q.get(timeout=1.0)
            break
        except queue.Empty:
            if not p.is_alive() and q.empty():
                raise RuntimeError(f"{fn.__name__} died in its process (exit code {p.exitcode})") from None
    p.join()
    if kind == "error":
        raise RuntimeError(f"{fn.__name__}{args}: {res}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--synthetic", type=int, default=1_000_000)
    ap.add_argument("--capacity-blocks", type=int, default=8192)
    ap.add_argument("--mooncake", type=int, default=None, help="only the first N Mooncake requests (default: all)")
    a = ap.parse_args()

    print(f"1. {a.requests:,}-request trace over the 52 fixture bodies (flare-47581cca)")
    new = in_fresh_process(fixture_trace_run, a.requests, "heap")
    print(f"   now (heaps)          {new[0]:7.1f} s  peak {new[2]} MiB  {new[1]}")
    if _old_cache_class() is not None:
        old = in_fresh_process(fixture_trace_run, a.requests, "before")
        print(f"   before ({BEFORE}, scans) {old[0]:7.1f} s  peak {old[2]} MiB  {old[1]}")
        print(f"   ratio before/now = {old[0] / new[0]:.2f}; same choices: {old[1] == new[1]}")
    else:
        print(f"   (git or commit {BEFORE} not available: no before-model to compare with)")

    if MOONCAKE != WHOLE_MOONCAKE:
        print(f"   ({WHOLE_MOONCAKE} not found: the Mooncake runs below take the tests' first 1,000 requests)")
    if MOONCAKE.is_file() and _old_cache_class() is not None:
        rows, pages = a.capacity_blocks // 2, a.capacity_blocks * 4
        print(f"1b. Mooncake conversation trace on {rows} rows and {pages} pages, lru_leaf: many records to choose from")
        new = in_fresh_process(mooncake_before_and_now, "now", rows, pages, a.mooncake)
        old = in_fresh_process(mooncake_before_and_now, "before", rows, pages, a.mooncake)
        print(f"   now (heaps)          {new[0]:7.1f} s  peak {new[2]} MiB  {new[1]}")
        print(f"   before ({BEFORE}, scans) {old[0]:7.1f} s  peak {old[2]} MiB  {old[1]}")
        print(f"   ratio before/now = {old[0] / new[0]:.2f}; same choices: {old[1] == new[1]}")

    if MOONCAKE.is_file():
        print(f"2. Mooncake conversation trace, {a.capacity_blocks} blocks of 512 tokens (rows in the scenario's proportion)")
        for pol in ("lru_leaf", "marconi", "protect_full_prompt", "block_lru"):
            dt, res, rss = in_fresh_process(trace_run, "mooncake", a.mooncake, pol, a.capacity_blocks)
            print(f"   {pol:20s} {dt:6.1f} s  peak {rss} MiB  {res['requests']:,} requests, reused {res['reused']:,} "
                  f"tokens ({100 * res['share']:.1f}%)  {({k: v for k, v in res.items() if k in ('evictions', 'compactions')})}")
    else:
        print(f"2. {MOONCAKE} not found: the Mooncake runs are skipped")

    print(f"3. synthetic conversations, lru_leaf, {a.capacity_blocks} blocks")
    for n in (a.synthetic // 10, a.synthetic):
        dt, res, rss = in_fresh_process(trace_run, "synthetic", n, "lru_leaf", a.capacity_blocks)
        goal = "  (goal under 45 s)" if n == a.synthetic else ""
        print(f"   {n:>9,} requests {dt:6.1f} s ({n / dt:,.0f} req/s)  peak {rss} MiB  reused {100 * res['share']:.1f}%{goal}")


if __name__ == "__main__":
    main()
