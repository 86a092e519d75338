"""Throughput of the host-cache model, run straight through (no HTTP), in one run:
the 52-body forward prime + reverse replay, and a 100,000-request trace drawn from the fixture
(zipf-like reuse of the 52 bodies), with the ratio of per-request cost between the two.

Usage: python bench/cache_model.py [--requests 100000] [--scenario flare-47581cca]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flare_diag.fixtures.flaresim.engine import Incarnation  # noqa: E402
from flare_diag.fixtures.flaresim.scenario import load_scenario  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "fixtures" / "data" / "c1-52"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--scenario", default="flare-47581cca")
    a = ap.parse_args()
    bodies = [ln.rstrip(b"\n") for ln in (DATA / "bodies.jsonl").open("rb")]
    parsed = [json.loads(b) for b in bodies]
    sc = load_scenario(a.scenario)
    inc = Incarnation(sc, "bench", "r", "s")
    t0 = time.perf_counter()
    for i in list(range(52)) + list(range(51, -1, -1)):
        inc.run_inline(bodies[i], parsed[i])
    small = time.perf_counter() - t0
    rng = random.Random(7)
    trace = [min(int(rng.paretovariate(1.2)) - 1, 51) for _ in range(a.requests)]
    inc = Incarnation(sc, "bench", "r", "s")
    t0 = time.perf_counter()
    for i in trace:
        inc.run_inline(bodies[i], parsed[i])
    big = time.perf_counter() - t0
    print(f"52-body forward+reverse: {small:.3f} s ({104 / small:,.0f} req/s)  (goal well under 1 s)")
    print(f"{a.requests:,}-request trace: {big:.1f} s ({a.requests / big:,.0f} req/s)  (goal under 60 s)"
          f"  per-request cost ratio trace/replay = {(big / a.requests) / (small / 104):.2f}")
    print(f"trace: host reused {inc.cache.c.reused_tokens:,} tokens, evictions {inc.cache.c.evictions}, "
          f"compactions {inc.cache.c.compactions}")


if __name__ == "__main__":
    main()
