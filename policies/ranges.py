"""Every numeric key of a plan and the range it must lie in: one table that `plan check`, `run`,
`start` and the docs (docs/plan-ranges.md) all read.

A range is physical (a fraction in (0, 1], a count of at least 1, a timeout above 0) or a bound the
daemon itself sets (a watch's silence no shorter than the daemon's own poll of it). A value outside
its range is refused before anything starts, naming the key, the value and the range.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

WATCH_POLL_S = 5.0  # window seconds between the runner's GPU and router polls (daemon/window/runner.py)
DAY_MIN, DAY_S, HUGE = 24 * 60, 86_400.0, float(2**62)


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    low_open: bool = False  # the low end itself is outside the range
    why: str = ""

    def holds(self, v: float) -> bool:
        return (v > self.low if self.low_open else v >= self.low) and v <= self.high and math.isfinite(v)

    def words(self) -> str:
        lo = "(" if self.low_open else "["
        return f"{lo}{self.low:g}, {'2^62' if self.high == HUGE else format(self.high, 'g')}]"


def _r(low: float, high: float, why: str = "", low_open: bool = False) -> Range:
    return Range(low, high, low_open, why)


POS = "a time or a rate above 0"
# key (with [] for every element of a list) -> its range
RANGES: dict[str, Range] = {
    "timing.window_min": _r(0, DAY_MIN, "the window, a day at most", True),
    "timing.stop_min": _r(0, DAY_MIN, "above 0 and below timing.window_min", True),
    "timing.restore_reserve_min": _r(0, DAY_MIN, POS, True),
    "timing.drain_timeout_s": _r(0, DAY_S, POS, True),
    "timing.stable_observations": _r(2, 1000, "the drain rule compares consecutive observations"),
    "timing.drain_poll_s": _r(0.01, 3600, "at least 10 ms between a drain's scrapes"),
    "timing.quiesce_drain_timeout_s": _r(0, DAY_S, POS, True),
    "timing.watch_lost_s": _r(WATCH_POLL_S, DAY_S, f"no shorter than the daemon's own poll of a watch ({WATCH_POLL_S:g} s)"),
    "timing.action_timeout_s": _r(0, DAY_S, POS, True),
    "timing.load_timeout_s": _r(0, DAY_S, POS, True),
    "timing.request_timeout_s": _r(0, DAY_S, POS, True),
    "timing.stall_s": _r(0, DAY_S, POS, True),
    "timing.arm_margin_min": _r(0, DAY_MIN, "minutes, 0 or more"),
    "timing.restore_budget_min": _r(0, DAY_MIN, POS, True),
    "rates.prefill_tokens_per_s": _r(0, 1e9, POS, True),
    "rates.decode_tokens_per_s": _r(0, 1e9, POS, True),
    "rates.output_share": _r(0, 1, "a fraction of max_tokens", True),
    "rates.request_overhead_s": _r(0, 3600, "seconds, 0 or more"),
    "rates.load_s": _r(0, DAY_S, "seconds, 0 or more"),
    "rates.chars_per_token": _r(0, 1e9, POS, True),
    "rates.probe_requests": _r(0, 16, "at most 16 bodies sent to the incumbent by a forecast"),
    "growth.max_resident_bytes": _r(0, HUGE, "bytes, above 0", True),
    "growth.max_host_cache_records": _r(0, HUGE, "a count, 0 or more"),
    "growth.max_gpu_memory_fraction": _r(0, 1, "a fraction of a GPU's memory", True),
    "growth.max_resident_growth_bytes": _r(0, HUGE, "bytes, above 0", True),
    "growth.max_queue_excess": _r(0, HUGE, "a count, 0 or more"),
    "growth.queue_excess_observations": _r(1, 10_000, "consecutive scrapes, at least 1"),
    "abort.rejected_streak": _r(1, 1000, "consecutive refused requests, at least 1"),
    "sampling.max_tokens": _r(1, 1_000_000, "tokens, at least 1"),
    "sampling.temperature": _r(0, 2, "the OpenAI range"),
    "sampling.top_p": _r(0, 1, "a probability mass", True),
    "fixtures[].max_tokens": _r(1, 1_000_000, "tokens, at least 1"),
    "fixtures[].temperature": _r(0, 2, "the OpenAI range"),
    "phases[].passes": _r(1, 100, "passes over the bodies, at least 1"),
    "phases[].concurrency": _r(1, 1024, "requests in flight, at least 1"),
    "phases[].select_last": _r(1, 1_000_000, "bodies, at least 1"),
    "trace.repetitions": _r(1, 100, "off/on pairs, at least 1"),
    "trace.concurrency[]": _r(1, 1024, "requests in flight, at least 1"),
    "trace.overhead_max": _r(0, 10, "a share of the off arms' median, 0 or more"),
    "trace.overhead_interval_max": _r(0, 10, "a share of the off arms' median, 0 or more"),
    "starting_observation.stores_per_request": _r(0, HUGE, "0 or more"),
    "starting_observation.records": _r(0, HUGE, "0 or more"),
    "starting_observation.bytes_used": _r(0, HUGE, "0 or more"),
    "starting_observation.bytes_capacity": _r(0, HUGE, "0 or more"),
    "starting_observation.restored_tokens": _r(0, HUGE, "0 or more"),
    "starting_observation.tolerance": _r(0, 1, "a relative difference"),
    "follow_on.repeats": _r(1, 100, "matched repeats, at least 1"),
    "guards[].threshold": _r(-HUGE, HUGE, "a finite number"),
    "guards[].consecutive": _r(1, 10_000, "consecutive breaches, at least 1"),
    "guards[].interval_s": _r(1, DAY_S, "seconds between evaluations, at least 1"),
    "identity.tensor_parallel": _r(1, 1024, "GPUs a model is split over, at least 1"),
    "identity.draft_tokens": _r(0, 1024, "speculative tokens, 0 or more"),
    "identity.host_cache_bytes": _r(0, HUGE, "bytes, 0 or more"),
    "identity.gpu_count": _r(0, 1024, "GPUs, 0 or more"),
    "identity.gpu_power_limit_w": _r(1, 10_000, "watts, above 0"),
    "follow_on.min_benefit": _r(0, 1, "a share"),
    "follow_on.max_regression": _r(0, 1, "a share"),
}


# The site profile's numbers (daemon/hosts/site.py reads them against this table when the profile loads)
SITE_RANGES: dict[str, Range] = {
    "engine.load_timeout_s": _r(0, DAY_S, "seconds a local engine's load may take to answer /health", True),
    "forecast.probe_requests": _r(0, 16, "the plan's own bodies the forecast may send, 0 (no probe) to 16"),
}

# The command line's numbers (daemon/cli/common.py `ranged` checks each as argparse reads it); the key is
# the flag as an operator types it, one range wherever the flag appears
FLAG_RANGES: dict[str, Range] = {
    "--repeats": _r(1, 20, "matched runs a side (a campaign's: runs per host)"),
    "--from-seq": _r(0, HUGE, "a sequence number of the log, 0 or more"),
    "--at": _r(1, HUGE, "a sequence number of the log, 1 or more"),
    "--minute": _r(0, DAY_MIN, "a window minute, 0 or more"),
    "--tolerance": _r(0, 1e9, "tokens a prediction may differ by, 0 or more"),
    "--capacity-blocks": _r(1, 1e9, "blocks, at least 1"),
    "--capacity-rows": _r(1, 1e9, "rows, at least 1"),
    "--limit": _r(1, HUGE, "the trace's first K requests, at least 1"),
    "--max-down": _r(0, 10_000, "primaries of the pool down at once (0: none may go down)"),
    "--retries": _r(0, 100, "times a run is requeued after its claim expires"),
    "--visibility-s": _r(1, DAY_S, "seconds a claimed run is kept without a renewal"),
}


def numbers(node: object, key: str = "") -> Iterator[tuple[str, str, float]]:
    """(table key, where, value) of every number in a plan's builtins (bools are not numbers)."""
    if isinstance(node, bool):
        return
    if isinstance(node, (int, float)):
        yield re.sub(r"\[\d+\]", "[]", key), key, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from numbers(v, f"{key}.{k}" if key else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from numbers(v, f"{key}[{i}]")


def out_of_range(builtins: dict[str, Any], table: dict[str, Range] | None = None) -> tuple[str, float, Range | None] | None:
    """The first number outside its range (or with no range in the table): (where, value, range)."""
    for key, where, v in numbers(builtins):
        rng = (RANGES if table is None else table).get(key)
        if rng is None:
            if not math.isfinite(v):
                return where, v, None
            continue
        if not rng.holds(v):
            return where, v, rng
    return None


HEAD = """# The ranges of a plan's numbers

Every number in a plan must lie in its range, or `plan check`, `run` and `start` refuse it (exit 2, nothing
changed), naming the key, the value and the range. `(a, b]` excludes `a`; `[a, b]` includes it. A key
with `[]` is every element of a list. The table is `policies/ranges.RANGES`; this page is rendered from it
(`python -m flare_diag.policies.ranges > docs/plan-ranges.md`) and a test holds the two equal.

Besides each key's own range, `plan check` relates keys to one another: `timing.stop_min` below
`timing.window_min`, the restore reserve between them, the restore's budget and its expected length
within the reserve, the follow-on's acceptance bar no looser than the seed's. Before a window opens the
growth bounds are also held to the incumbent as it serves (a bound it already breaches is refused), and
`--time-scale` to `policies.scaling.max_time_scale` (docs/departures.md, "scaled clocks").

"""


def render() -> str:
    """docs/plan-ranges.md: its opening words, then the table."""
    rows = ["| key | range | what it is |", "|---|---|---|"]
    rows += [f"| `{k}` | {r.words()} | {r.why} |" for k, r in RANGES.items()]
    site = ["", "## The site profile's numbers", "", "`site check`, `run`, `start` and the daemon refuse a profile with one "
            "outside its range, in one line naming the key.", "", "| key | range | what it is |", "|---|---|---|"]
    site += [f"| `{k}` | {r.words()} | {r.why} |" for k, r in SITE_RANGES.items()]
    flags = ["", "## The command line's numbers", "", "A flag's value outside its range is one line and exit 2 (as with "
             "any flag argparse refuses); `--time-scale`, `--seed`, `--port` and `--simulate` are checked where they "
             "are read, against the plan or the machine.", "", "| flag | range | what it is |", "|---|---|---|"]
    flags += [f"| `{k}` | {r.words()} | {r.why} |" for k, r in FLAG_RANGES.items()]
    return HEAD + "\n".join(rows + site + flags) + "\n"


if __name__ == "__main__":
    print(render(), end="")
