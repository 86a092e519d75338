"""Statistics beside the acceptance rule: a bootstrap interval for a relative difference and the
Mann-Whitney U test, both on per-request samples (as Kayenta judges a canary), deterministic by seed.

Small and pure on purpose (no SciPy): the rule needs two procedures, both textbook, both tested
against hand-worked cases in tests/test_stats.py; a 100 MB dependency for them would outweigh them.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence

import msgspec

BOOTSTRAP_RESAMPLES = 2000
ALPHA = 0.05
_MASK = (1 << 64) - 1
_BATCH_DRAWS = 1 << 16  # draws made at once (512 KB): resamples are taken from them in order


class _SplitMix64:
    """A seeded generator of its own (SplitMix64): the policies draw nothing from the OS, so the same
    samples give the same interval on every machine and in every audit.

    Its outputs are made a block at a time in one Python integer, each step's state in a 128-bit lane
    of its own: a lane holds a 64-bit value, a product of two of them fits its lane without a carry
    into the next, and every shift is masked back to the lanes. The numbers are the ones a step at a
    time gives (tests/test_stats.py holds both against each other), at about a quarter of the cost:
    a bootstrap's draws were three quarters of a `report compare`."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def draws(self, count: int) -> array[int]:
        """The next `count` outputs, as unsigned 64-bit values."""
        ones, lanes_mask, ramp = _lanes()
        out = array("Q")
        state = (self.state * ones + ((_GAMMA * ramp) & lanes_mask)) & lanes_mask  # lane j: step j + 1
        advance = ((_LANES * _GAMMA) & _MASK) * ones
        while len(out) < count:
            z = (((state ^ (state >> 30)) & lanes_mask) * 0xBF58476D1CE4E5B9) & lanes_mask
            z = (((z ^ (z >> 27)) & lanes_mask) * 0x94D049BB133111EB) & lanes_mask
            z = (z ^ (z >> 31)) & lanes_mask
            words = array("Q", z.to_bytes(_LANES * 16, "little"))
            if sys.byteorder == "big":
                words.byteswap()
            out.extend(words[:2 * min(_LANES, count - len(out)):2])
            state = (state + advance) & lanes_mask
        self.state = (self.state + count * _GAMMA) & _MASK
        return out


_GAMMA = 0x9E3779B97F4A7C15
_LANES = 512  # steps a block: big enough that Python's per-operation cost is spread thin


@functools.cache
def _lanes() -> tuple[int, int, int]:
    """(1 in every lane, 2**64 - 1 in every lane, j + 1 in lane j), lane j at bit 128 j."""
    def packed(values: Iterable[int]) -> int:
        return int.from_bytes(b"".join(v.to_bytes(16, "little") for v in values), "little")
    return packed([1] * _LANES), packed([_MASK] * _LANES), packed(range(1, _LANES + 1))


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
    per = nb + nc  # a resample's draws: the baseline's, then the candidate's
    batch = max(1, _BATCH_DRAWS // per)
    values: list[float] = []
    while len(values) < resamples:
        k = min(batch, resamples - len(values))
        raw = rng.draws(k * per)
        for at in range(0, k * per, per):
            b = stat([baseline[x % nb] for x in raw[at:at + nb]])
            c = stat([candidate[x % nc] for x in raw[at + nb:at + per]])
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


def mean_of(per_window: Sequence[float]) -> float:
    """The acceptance rule's figure for one side: the mean over its repeats of each repeat's statistic
    (policies/acceptance.py sums and divides the same way, so the two agree to the last bit)."""
    return sum(per_window) / len(per_window)


def compare_repeats(metric: str, baseline: Sequence[Sequence[float]], candidate: Sequence[Sequence[float]],
                    stat: Callable[[Sequence[float]], float] = statistics.median, seed: int = 0,
                    resamples: int = BOOTSTRAP_RESAMPLES, level: float = 0.95) -> MetricStats | None:
    """The change the acceptance rule decides on (each side: the mean over its windows of each window's
    `stat` of its requests) with a bootstrap interval for that same figure: each window's requests are
    resampled within it, the windows kept (they are the repeats the rule names), and the figure
    recomputed. The Mann-Whitney test beside it is on all requests of each side."""
    if not baseline or not candidate or any(len(w) < 2 for w in (*baseline, *candidate)):
        return None
    b, c = mean_of([stat(w) for w in baseline]), mean_of([stat(w) for w in candidate])
    rng = _SplitMix64(seed)
    windows = [*baseline, *candidate]
    per = sum(len(w) for w in windows)
    values = []
    for _ in range(resamples):
        raw, at, figures = rng.draws(per), 0, []
        for w in windows:
            n = len(w)
            figures.append(stat([w[x % n] for x in raw[at:at + n]]))
            at += n
        values.append(relative_change(mean_of(figures[:len(baseline)]), mean_of(figures[len(baseline):])))
    values.sort()
    lo = values[int((1 - level) / 2 * (resamples - 1))]
    hi = values[int((1 + level) / 2 * (resamples - 1))]
    pooled_b = [x for w in baseline for x in w]
    pooled_c = [x for w in candidate for x in w]
    _u, p = mann_whitney_u(pooled_c, pooled_b)
    return MetricStats(metric, b, c, relative_change(b, c), (lo, hi), p, len(pooled_b), len(pooled_c),
                       noise_could_explain=lo <= 0.0 <= hi or p >= ALPHA)
