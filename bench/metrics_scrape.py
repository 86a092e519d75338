"""What reading an engine's /metrics costs the window, side by side in one run: the parse as the daemon
does it (only the lines of the families it reads reach prometheus-client's parser) against the same
parser over the whole exposition (as it was before), on a vLLM-sized exposition.

The window scrapes /metrics after every C1 request. vLLM v1 exposes, per engine rank and model, a
dozen latency and size histograms (a line per bucket) beside the few counters and gauges the contract
maps; this bench composes that shape around tests/data/metrics/vllm-v1.prom (names and buckets as
vLLM's metrics docs list them) with `--engines` data-parallel ranks. Both ways must read the same values.

Usage: python bench/metrics_scrape.py [--engines 4] [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flare_diag.daemon.hosts import metrics  # noqa: E402
from flare_diag.daemon.hosts.engine_profiles import metric_names  # noqa: E402

LATENCY_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000]
HISTOGRAMS = {  # family -> buckets
    "vllm:time_to_first_token_seconds": LATENCY_BUCKETS, "vllm:inter_token_latency_seconds": LATENCY_BUCKETS,
    "vllm:e2e_request_latency_seconds": LATENCY_BUCKETS, "vllm:request_queue_time_seconds": LATENCY_BUCKETS,
    "vllm:request_inference_time_seconds": LATENCY_BUCKETS, "vllm:request_prefill_time_seconds": LATENCY_BUCKETS,
    "vllm:request_decode_time_seconds": LATENCY_BUCKETS, "vllm:request_prompt_tokens": TOKEN_BUCKETS,
    "vllm:request_generation_tokens": TOKEN_BUCKETS, "vllm:request_params_n": [1, 2, 5, 10, 20],
    "vllm:request_params_max_tokens": TOKEN_BUCKETS, "vllm:iteration_tokens_total": TOKEN_BUCKETS,
}


def exposition(engines: int) -> str:
    """The recorded-shape sample, then every histogram for each engine rank."""
    lines = [(ROOT / "tests" / "data" / "metrics" / "vllm-v1.prom").read_text().rstrip("\n")]
    for family, buckets in HISTOGRAMS.items():
        lines += [f"# HELP {family} {family.split(':')[1].replace('_', ' ')}.", f"# TYPE {family} histogram"]
        for e in range(engines):
            labels = f'engine="{e}",model_name="glm"'
            for i, le in enumerate(buckets):
                lines.append(f'{family}_bucket{{{labels},le="{le}"}} {float(i * 37 + e)}')
            lines += [f'{family}_bucket{{{labels},le="+Inf"}} {float(len(buckets) * 37 + e)}',
                      f"{family}_count{{{labels}}} {float(len(buckets) * 37 + e)}",
                      f"{family}_sum{{{labels}}} {1234.5 + e}"]
        created = f"{family.removesuffix('_total')}_created"
        lines += [f"# HELP {created} created", f"# TYPE {created} gauge"]
        lines += [f'{created}{{engine="{e}",model_name="glm"}} 1.7959e+09' for e in range(engines)]
    return "\n".join(lines) + "\n"


def whole(text: str, names: dict[str, str]) -> dict:
    """The parse before: every family through prometheus-client's parser, then the same shaping."""
    return metrics.shape(metrics.families(text), names)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args()
    text = exposition(a.engines)
    names = metric_names("vllm", {})
    if metrics.parse(text, names) != whole(text, names):
        raise SystemExit("the two parses read different values")
    now, before = [], []
    for _ in range(a.rounds):  # alternated, so that machine noise falls on both alike
        t0 = time.perf_counter()
        metrics.parse(text, names)
        t1 = time.perf_counter()
        whole(text, names)
        t2 = time.perf_counter()
        now.append(t1 - t0)
        before.append(t2 - t1)
    n, b = statistics.median(now), statistics.median(before)
    print(f"vLLM-shaped /metrics, {a.engines} engine ranks: {len(text):,} bytes, {text.count(chr(10)):,} lines; "
          f"the same values both ways")
    print(f"  the daemon's parse (the families it reads) {n * 1e3:8.2f} ms median of {a.rounds}")
    print(f"  the whole exposition through the parser    {b * 1e3:8.2f} ms")
    print(f"  (ratio read/whole {n / b:.3f})")


if __name__ == "__main__":
    main()
