"""The statistics beside the acceptance rule, against cases worked by hand."""

from __future__ import annotations

import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from flare_diag.events.stats import bootstrap_interval, compare_metric, mann_whitney_u, relative_change


def test_mann_whitney_u_of_two_separated_samples_counts_every_pair():
    u, p = mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert u == 0 and p < 0.02  # exact two-sided p is 0.0079; the normal approximation gives 0.012


def test_mann_whitney_u_with_ties_splits_their_ranks():
    u, _p = mann_whitney_u([1, 2, 2], [2, 3])
    # ranks: 1 -> 1, the three 2s -> 3 each, 3 -> 5; R1 = 1 + 3 + 3 = 7; U1 = 7 - 6 = 1
    assert u == 1


def test_identical_samples_are_explained_by_noise():
    s = compare_metric("ttft", [10.0, 11.0, 12.0, 13.0], [10.0, 11.0, 12.0, 13.0])
    assert s.change == 0 and s.noise_could_explain and s.mann_whitney_p > 0.5


def test_a_clear_shift_is_not_explained_by_noise_and_its_interval_holds_the_change():
    base = [100.0 + i % 7 for i in range(60)]
    cand = [80.0 + i % 7 for i in range(60)]
    s = compare_metric("ttft", base, cand)
    assert s.change == relative_change(statistics.median(base), statistics.median(cand))
    assert s.interval[0] <= s.change <= s.interval[1] and s.interval[0] > 0.1
    assert not s.noise_could_explain


def test_the_bootstrap_is_the_same_for_the_same_seed():
    a, b = [1.0, 5.0, 3.0, 9.0], [2.0, 2.5, 8.0, 1.0]
    assert bootstrap_interval(a, b, statistics.median, seed=4) == bootstrap_interval(a, b, statistics.median, seed=4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1, 1e4), min_size=2, max_size=30), st.lists(st.floats(1, 1e4), min_size=2, max_size=30))
def test_u_statistics_of_the_two_sides_sum_to_the_number_of_pairs(a, b):
    u_a, p_a = mann_whitney_u(a, b)
    u_b, p_b = mann_whitney_u(b, a)
    assert abs(u_a + u_b - len(a) * len(b)) < 1e-6 and abs(p_a - p_b) < 1e-9 and 0 <= p_a <= 1


def _splitmix64_one_step_at_a_time(seed: int, count: int) -> list[int]:
    """SplitMix64 as published (Steele, Lea and Flood 2014; Vigna's reference C), one step at a time."""
    mask, state, out = (1 << 64) - 1, seed & ((1 << 64) - 1), []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append(z ^ (z >> 31))
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**70), st.lists(st.integers(0, 1300), min_size=1, max_size=3))
def test_the_generators_blocks_are_the_numbers_of_one_step_at_a_time(seed, counts):
    from flare_diag.events.stats import _SplitMix64
    rng = _SplitMix64(seed)
    drawn = [x for n in counts for x in rng.draws(n)]  # block after block, continuing the stream
    assert drawn == _splitmix64_one_step_at_a_time(seed, sum(counts))


def test_an_interval_is_the_one_earlier_versions_gave_for_the_same_samples():
    # computed one draw at a time before the draws came in blocks: a report re-rendered from an old
    # log must show the interval it showed then
    assert bootstrap_interval([1.0, 5.0, 3.0, 9.0], [2.0, 2.5, 8.0, 1.0], statistics.median, seed=4) == (
        -1.6666666666666667, 0.8)
    base = [100.0 + (i * 37) % 23 for i in range(700)]
    cand = [90.0 + (i * 53) % 29 for i in range(650)]  # 1,350 draws a resample: several to a batch
    assert compare_metric("ttft", base, cand).interval == (0.049773755656108594, 0.07589285714285714)


def test_the_repeats_change_is_the_acceptance_rules_benefit_to_the_last_bit():
    from flare_diag.events.stats import compare_repeats
    from flare_diag.policies.acceptance import Run, accept
    base = [[100.0 + (i * 7 + k) % 13 for i in range(40)] for k in range(3)]
    cand = [[93.0 + (i * 5 + k) % 11 for i in range(40)] for k in range(3)]
    s = compare_repeats("median_ttft_ms", base, cand)
    verdict = accept([Run("f", True, statistics.median(w)) for w in cand], [Run("f", True, statistics.median(w)) for w in base])
    assert s.change == verdict.primary_benefit
    assert s.interval[0] <= s.change <= s.interval[1]


def test_pooled_medians_and_the_rules_mean_of_medians_can_differ_and_the_repeats_figure_is_the_rules():
    from flare_diag.events.stats import compare_repeats
    # one slow baseline repeat: the pooled median hardly moves, the mean of the repeats' medians does
    base = [[100.0] * 30, [100.0] * 30, [160.0] * 30]
    cand = [[100.0] * 30, [100.0] * 30, [100.0] * 30]
    pooled = compare_metric("m", [x for w in base for x in w], [x for w in cand for x in w])
    s = compare_repeats("m", base, cand)
    assert pooled.change == 0.0 and s.change == (120.0 - 100.0) / 120.0
