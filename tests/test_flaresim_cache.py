"""The CPU reproducer of Flare's hybrid host cache, run straight through the model."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from flare_diag.fixtures.flaresim.engine import Incarnation
from flare_diag.fixtures.flaresim.scenario import load_scenario
from tests.simtools import bodies, parsed

B, P = bodies(), parsed()


def _primed(scenario: str) -> Incarnation:
    inc = Incarnation(load_scenario(scenario), "i", "r", "s")
    for b, p in zip(B, P):
        inc.run_inline(b, p)
    return inc


def _replay(inc: Incarnation, order: list[int]) -> list[int]:
    out = []
    for i in order:
        before = inc.cache.c.reused_tokens
        inc.run_inline(B[i], P[i])
        out.append(inc.cache.c.reused_tokens - before)
    return out


def test_default_scenario_reproduces_the_seed_observation():
    inc = _primed("flare-47581cca")
    c = inc.cache
    assert c.c.stores == {"message_prefix": 52, "full_prompt": 52, "terminal": 52}
    assert c.rows_used == 52
    assert abs(c.bytes_used / 2**30 - 8.731) < 0.01
    assert c.bytes_capacity == 32 * 2**30
    assert sum(_replay(inc, list(range(52)))) == 0


def test_free_bytes_are_not_free_rows_in_the_default_scenario():
    c = _primed("flare-47581cca").cache
    assert c.rows_used == c.rows_capacity and c.bytes_used < c.bytes_capacity / 2


def test_churn_scenario_restores_on_reverse_replay():
    assert sum(_replay(_primed("churn"), list(range(51, -1, -1)))) > 0


def test_churn_scenario_restores_the_last_twelve_bodies_on_both_passes():
    per = _replay(_primed("churn"), list(range(40, 52)) * 2)
    assert all(x > 0 for x in per[:12]) and all(x > 0 for x in per[12:])


def test_churn_scenario_restores_nothing_on_forward_replay():
    assert sum(_replay(_primed("churn"), list(range(52)))) == 0


def test_ineligible_scenario_restores_on_neither_order_nor_the_small_control():
    assert sum(_replay(_primed("ineligible"), list(range(51, -1, -1)))) == 0
    assert sum(_replay(_primed("ineligible"), list(range(40, 52)) * 2)) == 0


def test_large_row_pool_restores_on_forward_replay():
    assert sum(_replay(_primed("large-rows"), list(range(52)))) > 0


def test_no_checkpoint_at_or_past_a_prompts_end_is_ever_used():
    for sc in ("flare-47581cca", "large-rows"):
        inc = Incarnation(load_scenario(sc), "i", "r", "s")
        for i in list(range(52)) + list(range(51, -1, -1)):
            p = inc.run_inline(B[i], P[i])
            if p.lookup.host is not None:
                assert p.lookup.host.pos < p.prompt_len
                assert p.lookup.host.kind != "terminal" or p.lookup.host.pos < p.prompt_len


def test_eviction_takes_leaves_before_compacting_ancestors():
    inc = _primed("flare-47581cca")
    assert inc.cache.c.evictions["row"] > 0 and inc.cache.c.compactions == 0


def test_alternative_eviction_strategies_run_and_keep_pools_within_capacity():
    import msgspec
    base = load_scenario("flare-47581cca")
    for mode in ("marconi", "protect_full_prompt"):
        inc = Incarnation(msgspec.structs.replace(base, eviction=mode), "i", "r", "s")
        for b, p in zip(B + B[::-1], P + P[::-1]):
            inc.run_inline(b, p)
        assert inc.cache.rows_used <= inc.cache.rows_capacity
        assert inc.cache.pages_used <= inc.cache.pages_capacity


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(2, 40), pages=st.integers(4, 200),
       policy=st.sampled_from(["lru_leaf", "marconi", "protect_full_prompt"]), compaction=st.booleans())
def test_the_held_pages_are_exactly_the_pages_of_the_live_records(seed, rows, pages, policy, compaction):
    """Pages are held by walking only the pages that change (cache.py); whatever the evictions and
    compactions, what is held is what the records hold, and every page that left was counted."""
    import msgspec

    from flare_diag.fixtures.flaresim.cache import HostCache, store_prompt, store_terminal
    from flare_diag.fixtures.flaresim.trace import MOONCAKE_BLOCK as BLK, request_seqs, synthetic_trace, trace_scenario
    sc = trace_scenario(msgspec.structs.replace(load_scenario("flare-47581cca"), eviction=policy,
                                                ancestor_compaction=compaction), BLK)
    cache = HostCache(sc, rows_capacity=rows, pages_capacity=pages)
    ever: set[bytes] = set()
    for n, r in enumerate(synthetic_trace(60, seed=seed, conversations=6)):
        prompt, term = request_seqs(r, n, BLK)
        cache.lookup(prompt, r.input_length)
        pinned = store_prompt(cache, prompt, r.input_length, ((r.input_length - 1) // BLK) * BLK)
        store_terminal(cache, term, term.length, pinned)
        live = {p for cp in cache.records.values() for p in cp.pages}
        assert set(cache.held) == live
        assert cache.pages_used <= cache.pages_capacity
        ever |= live
    assert cache.c.evictions["page"] >= len(ever) - cache.pages_used


@settings(max_examples=100, deadline=None)
@given(turns=st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(-3, 40), min_size=0, max_size=4), st.booleans()),
                      max_size=60),
       size=st.integers(1, 4))
def test_recent_prompts_chain_keys_are_the_keys_of_chaining_every_block(turns, size):
    """Conversations (some sharing a first block, some restarting, some diverging) through a memo
    small enough to forget: every prompt gets the keys of chaining all its blocks."""
    from flare_diag.fixtures.flaresim.trace import RecentChains, _chain
    chains, prompts = RecentChains(size), {}
    for conversation, new_blocks, restart in turns:
        ids = [] if restart else prompts.get(conversation, [])
        ids = (ids or [conversation]) + new_blocks
        prompts[conversation] = ids
        assert chains.chain(ids) == _chain(ids)
        assert chains.chain(ids[:-1]) == _chain(ids[:-1])  # a shorter prompt than the one remembered
