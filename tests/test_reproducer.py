"""The seed's CPU reproducer: a window's own requests through the host-cache model (it must agree
with a rehearsal on every request), eviction policies side by side, and real block-level traces."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import msgspec
import pytest

from flare_diag.daemon.cli.commands import main
from flare_diag.fixtures.flaresim.scenario import load_scenario
from flare_diag.fixtures.flaresim.trace import read_trace, run_host_cache, synthetic_trace

ROOT = Path(__file__).resolve().parent.parent
SLICE = ROOT / "tests" / "data" / "mooncake" / "conversation-1000.jsonl"
POLICIES = ("lru_leaf", "marconi", "protect_full_prompt")


def _reproduce(capsys, *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    rc = main(["reproduce", *args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_reproduce_on_a_rehearsals_log_agrees_with_the_observed_host_reuse_of_every_request(default_rehearsal, capsys):
    _rc, r, out = default_rehearsal
    rc, rep = _reproduce(capsys, str(out / "log.db"))
    observed = [q for q in r["requests"] if q["delta"].get("host_reused_tokens") is not None]
    assert rc == 0 and rep["reproduces"] is True
    assert rep["compared"] == len(observed) > 200 and rep["agreed"] == rep["compared"] and rep["divergences"] == []
    assert rep["predicted_total"] == rep["observed_total"] == sum(q["delta"]["host_reused_tokens"] for q in observed)
    assert (rep["rows_capacity"], rep["pages_capacity"]) == (52, 5720) and rep["geometry_source"] == "the window's gauges"


def test_a_model_that_does_not_reproduce_the_window_says_so_lists_where_and_exits_1(default_rehearsal, capsys):
    out = default_rehearsal[2]
    capsys.readouterr()
    rc = main(["reproduce", str(out / "log.db"), "--scenario", "ineligible"])  # other checkpoint eligibility
    text = capsys.readouterr().out
    assert rc == 1 and "DOES NOT reproduce the window" in text and "diverges: A.reverse_replay #" in text


def test_policies_run_side_by_side_on_the_windows_own_requests_with_a_table_and_charts(default_rehearsal, tmp_path, capsys):
    out = default_rehearsal[2]
    rc, rep = _reproduce(capsys, str(out / "log.db"), "--policies", ",".join((*POLICIES, "block_lru")),
                         "--out", str(tmp_path / "repro"))
    assert rc == 0
    by = {p["policy"]: p for p in rep["policies"]}
    assert list(by) == [*POLICIES, "block_lru"]
    assert by["lru_leaf"]["reused_tokens"] == rep["observed_total"]  # the window's own policy is the observed one
    for name in POLICIES:
        p = by[name]
        assert set(p["stores"]) == {"message_prefix", "full_prompt", "terminal"} and set(p["evictions"]) == {"row", "page"}
        assert 0 < p["rows_used_peak"] <= p["rows_capacity"] and 0 < p["pages_used_peak"] <= p["pages_capacity"]
    page = (tmp_path / "repro" / "reproduce.html").read_text()
    assert 'id=chart-reused' in page and 'id=chart-churn' in page and "<script" not in page
    assert json.loads((tmp_path / "repro" / "reproduce.json").read_text())["window_id"] == rep["window_id"]


def test_the_block_lru_baseline_on_the_trace_slice_equals_a_plain_ordered_dict_of_blocks(capsys):
    capacity = 3000
    rc, rep = _reproduce(capsys, "--trace", str(SLICE), "--capacity-blocks", str(capacity), "--policies", "block_lru")
    assert rc == 0
    # the straightforward computation: a request reuses the leading run of its full prompt blocks
    # found in the cache; then every full block is touched in order; the least recent beyond capacity go
    lru: OrderedDict[int, None] = OrderedDict()
    reused = 0
    for line in SLICE.read_text().splitlines():
        r = json.loads(line)
        blocks = r["hash_ids"][: r["input_length"] // 512]
        run = 0
        while run < len(blocks) and blocks[run] in lru:
            run += 1
        reused += run * 512
        for b in blocks:
            lru.pop(b, None)
            lru[b] = None
        while len(lru) > capacity:
            lru.popitem(last=False)
    assert rep["requests"] == 1000 and rep["results"][0]["reused_tokens"] == reused > 0


def test_reproduce_trace_gives_reused_tokens_per_policy_and_capacity_as_json(capsys):
    rc, rep = _reproduce(capsys, "--trace", str(SLICE), "--capacity-blocks", "1000", "--capacity-blocks", "8000")
    assert rc == 0 and rep["block_tokens"] == 512
    got = {(x["capacity_blocks"], x["policy"]): x["reused_tokens"] for x in rep["results"]}
    assert set(got) == {(c, p) for c in (1000, 8000) for p in (*POLICIES, "block_lru")}
    assert all(got[(8000, p)] >= got[(1000, p)] for p in ("lru_leaf", "block_lru"))  # more room never reuses less here


def test_a_trace_line_that_is_not_a_request_is_one_line_naming_it_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "t.jsonl"
    bad.write_text(SLICE.read_text().splitlines()[0] + '\n{"input_length": "many"}\n')
    capsys.readouterr()
    assert main(["reproduce", "--trace", str(bad), "--capacity-blocks", "10"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_heap_selection_chooses_exactly_what_scanning_every_record_chooses(policy):
    sc = msgspec.structs.replace(load_scenario("flare-47581cca"), eviction=policy)
    reqs = list(synthetic_trace(3000, seed=11)) + list(read_trace(SLICE, limit=300))
    for rows, pages in ((40, 900), (6, 900)):  # room to choose among leaves; so few rows that ancestors compact
        (heap, hs), (scan, ss) = [run_host_cache(reqs, sc, rows, pages, selection=sel) for sel in ("heap", "scan")]
        assert hs == ss and heap.c == scan.c
        assert heap.c.evictions["row"] > 1000  # the choices were really exercised
    assert heap.c.compactions > 100


def test_the_synthetic_trace_is_the_one_randint_draws_for_its_seed():
    """The bench's trace draws its integers without Random.randint's call overhead; it must stay the
    trace that randint would draw, so that figures measured before and after compare."""
    import random

    def reference(n, seed):
        rng, turns, next_id = random.Random(seed), {}, 0
        for _ in range(n):
            c = min(int(rng.paretovariate(1.1)) - 1, 1999)
            ids = turns.get(c)
            ids = [] if ids is None or len(ids) > 36 else ids
            grow = rng.randint(1, 3)
            ids = ids + list(range(next_id, next_id + grow))
            next_id += grow
            turns[c] = ids
            yield (len(ids) * 512 - rng.randint(0, 511), rng.randint(16, 600), ids)

    drawn = [(r.input_length, r.output_length, r.hash_ids) for r in synthetic_trace(5000, seed=3)]
    assert drawn == list(reference(5000, 3))
    assert len({length for length, _, _ in drawn}) > 1000


def test_the_models_memory_is_bounded_by_the_cache_not_by_the_trace():
    sc = load_scenario("flare-47581cca")
    cache, st = run_host_cache(synthetic_trace(20000, seed=3), sc, 64, 2000)
    assert st.requests == 20000 and cache.rows_used <= 64 and cache.pages_used <= 2000
    live = len(cache.records)
    assert len(cache._leaves) + len(cache._ancestors) <= 4 * live + 64 and len(cache.index) <= live


def test_reproduce_trace_with_out_writes_the_json_and_a_page_with_its_capacity_chart(tmp_path, capsys):
    rc, rep = _reproduce(capsys, "--trace", str(SLICE), "--capacity-blocks", "500", "--capacity-blocks", "4000",
                         "--limit", "200", "--out", str(tmp_path))
    assert rc == 0 and rep["requests"] == 200
    assert json.loads((tmp_path / "reproduce.json").read_text()) == rep
    page = (tmp_path / "reproduce.html").read_text()
    assert "id=chart-capacity" in page and 'class="tick-x"' in page and "<script" not in page


def test_reproduce_fit_on_a_rehearsals_log_picks_the_seeds_pools_at_the_windows_own_capacity(default_rehearsal, capsys):
    out = default_rehearsal[2]
    rc, fitted = _reproduce(capsys, str(out / "log.db"), "--fit")
    assert rc == 0 and fitted["best"]["family"] == "seed_pools" and fitted["best"]["capacity"] == 52
    assert fitted["best"]["agreed"] == fitted["best"]["compared"] > 200
    assert all(f["agreed"] < fitted["best"]["agreed"] for f in fitted["runners_up"])
    assert set(fitted["policies"]) == set(POLICIES)


def test_a_fitted_block_lru_compares_its_policy_on_each_bodys_block_chain_not_on_its_bytes():
    """The block LRU's reuse at the fitted capacity is read over each body's chain of block keys; a body's
    raw bytes read as blocks would be blocks of one byte each (what fit_window once passed it)."""
    from flare_diag.daemon.reproducer.fit import Fit, _blocks, _policies_at
    from flare_diag.daemon.reproducer.reproduce import Segment, Sent
    from flare_diag.daemon.simulator import TokenSeq, load_scenario
    sc = load_scenario("flare-47581cca")
    tokens = list(range(4 * sc.block_tokens))
    chains = {"a": TokenSeq(tokens, sc.block_tokens).chain}
    bodies = {"a": b'{"messages": []}'}
    segments = [Segment("i1", [Sent("p", k, "a", None, prompt_tokens=len(tokens)) for k in range(3)])]
    policies, _note = _policies_at(Fit("block_lru", 8, 0, 0), segments, {}, bodies, chains, sc)
    assert policies == {"block_lru": sum(_blocks(segments, chains, sc, 8))} == {"block_lru": 2 * 4 * sc.block_tokens}
