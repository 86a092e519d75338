"""Statistics beside the acceptance rule: a bootstrap interval for a relative difference and the
Mann-Whitney U test, both on per-request samples (as Kayenta judges a canary), deterministic by seed.

Small and pure on purpose (no SciPy): the rule needs two procedures, both textbook, both tested
against hand-worked cases in tests/test_stats.py; a 100 MB dependency for them would outweigh them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import msgspec

BOOTSTRAP_RESAMPLES = 2000
ALPHA = 0.05
_MASK = (1 << 64) - 1


class _SplitMix64:
    """A seeded generator of its own (SplitMix64): the policies draw nothing from the OS, so the same
    samples give the same interval on every machine and in every audit."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def below(self, n: int) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return (z ^ (z >> 31)) % n


def p95(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[int(0.95 * (len(s) - 1))]


def relative_change(baseline: float, candidate: float) -> float:
    """(baseline - candidate) / baseline: positive when the candidate is lower (better, for a latency)."""
    return (baseline - candidate) / baseline if baseline else math.nan


def bootstrap_interval(baseline: Sequence[float], candidate: Sequence[float], stat: Callable[[Sequence[float]], float],
                       resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of relative_change(stat(baseline), stat(candidate)), each side resampled with
    replacement `resamples` times."""
    rng = _SplitMix64(seed)
    nb, nc = len(baseline), len(candidate)
    values = []
    for _ in range(resamples):
        b = stat([baseline[rng.below(nb)] for _ in range(nb)])
        c = stat([candidate[rng.below(nc)] for _ in range(nc)])
        values.append(relative_change(b, c))
    values.sort()
    lo = values[int((1 - level) / 2 * (resamples - 1))]
    hi = values[int((1 + level) / 2 * (resamples - 1))]
    return lo, hi


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(U of `a`, two-sided p) by the normal approximation with the tie correction and a continuity
    correction; p = 1 when every value is tied."""
    n1, n2 = len(a), len(b)
    pooled = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        r = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[k] = r
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    r1 = sum(r for r, (_x, side) in zip(ranks, pooled) if side == 0)
    u1 = r1 - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return u1, 1.0
    z = (abs(u1 - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return u1, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


class MetricStats(msgspec.Struct, frozen=True):
    metric: str
    baseline: float
    candidate: float
    change: float  # relative_change: a benefit when positive
    interval: tuple[float, float]
    mann_whitney_p: float
    n_baseline: int
    n_candidate: int
    noise_could_explain: bool  # the interval holds 0, or the test does not reject at ALPHA


def compare_metric(metric: str, baseline: Sequence[float], candidate: Sequence[float],
                   stat: Callable[[Sequence[float]], float] = statistics.median, seed: int = 0) -> MetricStats | None:
    if len(baseline) < 2 or len(candidate) < 2:
        return None
    b, c = stat(baseline), stat(candidate)
    lo, hi = bootstrap_interval(baseline, candidate, stat, seed=seed)
    _u, p = mann_whitney_u(candidate, baseline)
    return MetricStats(metric, b, c, relative_change(b, c), (lo, hi), p, len(baseline), len(candidate),
                       noise_could_explain=lo <= 0.0 <= hi or p >= ALPHA)
