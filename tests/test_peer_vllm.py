"""The seed's method through `run` against a real vLLM (0.32.0, the CPU build) serving a tiny Llama: a
prefix cache smaller than the replay (churn), what the window reads from it, the fit that recovers its
size, and a KV connector whose every load fails. The daemon runs the engine itself (site profile
`[engine] kind = "vllm"`); with no KV connector the engine has no host tier, so the plan's verdict reads
the GPU prefix cache, sized in 128-token blocks. tests/test_peer_vllm_more.py has the rest (its own
servers, on another worker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flare_diag.events.reader import LogReader
from tests.vllmtools import ENGINE, PLAN, SMALL_BLOCKS, cell, cli, run_window, write_site


@pytest.fixture(scope="module")
def small_cache_window(tmp_path_factory, vllm_python, model) -> tuple[int, dict, Path]:
    """One window against vLLM with a 64-block prefix cache: (exit code, report, out)."""
    return run_window(tmp_path_factory.mktemp("small-cache"), vllm_python, model, SMALL_BLOCKS)


def test_real_vllm_with_a_prefix_cache_smaller_than_the_replay_shows_churn(small_cache_window):
    rc, r, _out = small_cache_window
    assert (rc, r["outcome"]) == (0, "completed"), (r["outcome"], r.get("abort"), r["cells"])
    assert r["verdict"]["hypothesis"] == "prefix_cache_churn", r["verdict"]
    assert cell(r, "A.reverse_replay")["gpu"]["reused_tokens"] > 0
    assert cell(r, "B.forward_replay")["gpu"]["reused_tokens"] == 0
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]


def test_real_vllm_window_restores_the_incumbent_and_verifies_it_with_accepted_preflights(small_cache_window):
    _rc, r, _out = small_cache_window
    res = r["restoration"]
    assert res["verified"] and res["incumbent_sha256_match"], res
    assert res["direct_preflight"] is True and res["routed_preflight"] is None  # no router on this site


def test_real_vllm_without_a_connector_has_no_host_reuse_and_never_a_host_cause(small_cache_window):
    _rc, r, _out = small_cache_window
    assert all(c["host"]["reused_tokens"] is None for c in r["cells"] if c.get("host"))
    assert r["verdict"]["hypothesis"] not in ("row_checkpoint_churn", "restore_path", "key_or_checkpoint_eligibility")


def test_real_vllm_prefix_reuse_per_request_is_the_engines_own_cached_tokens(small_cache_window):
    _rc, r, _out = small_cache_window
    measured = [q for q in r["requests"] if q.get("cached_tokens") is not None]
    assert measured and all(q["delta"]["gpu_reused_tokens"] == q["cached_tokens"] for q in measured)
    assert sum(q["cached_tokens"] for q in measured) > 0


def test_real_vllm_resident_memory_is_the_whole_engine_process_group(small_cache_window):
    _rc, _r, out = small_cache_window
    with LogReader(out / "log.db") as reader:
        resident = [ev.data["gauges"]["resident_bytes"] for e in reader.iter() if e.type == "action_done"
                    for ev in [e.event()] if isinstance(ev.data, dict) and "gauges" in ev.data]
    seen = [v for v in resident if v is not None]
    # the API server alone holds about 0.7 GiB; with its engine core, worker and 1 GiB of KV cache, more
    assert seen and min(seen) > 1 << 30, seen[:5]


def test_reproduce_fit_recovers_the_real_vllm_windows_block_capacity(small_cache_window):
    """The window saw GPU reuse only (no KV connector): the fit reads each request's cached tokens
    against vLLM's block pool and finds the capacity the engine itself states (kv_num_gpu_blocks)."""
    _rc, _r, out = small_cache_window
    p = cli("reproduce", str(out / "log.db"), "--fit", "--json", timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    best = json.loads(p.stdout)["best"]
    assert (best["family"], best["capacity"]) == ("vllm_blocks", SMALL_BLOCKS), best
    assert best["agreed"] == best["compared"] > 100, best


def write_failing_connector_site(tmp: Path, python: Path, model: Path) -> tuple[Path, Path]:
    """The peer site with a KV connector whose loads all fail (fixtures/engines/vllm/failing_connector.py)
    behind a 64-block prefix cache, and the peer plan (its verdict on the prefix cache: vLLM's figures
    for the connector count failed loads too, so host reuse is not observable)."""
    config = json.dumps({"kv_connector": "FailingLoadConnector", "kv_connector_module_path": "failing_connector",
                         "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                         "kv_connector_extra_config": {"shared_storage_path": str(tmp / "kv-store")}})
    text = "\n".join(line for line in PLAN.read_text().splitlines() if not line.startswith("host_cache_bytes"))
    plan, site = write_site(tmp, python, model, SMALL_BLOCKS, text)
    profile = site.read_text()
    for seqs in ("16", "8"):
        profile = profile.replace(f'"--max-num-seqs", "{seqs}"]', f'"--max-num-seqs", "{seqs}", "--kv-transfer-config", \'{config}\']')
    site.write_text(profile.replace("env = { ", f'env = {{ PYTHONPATH = "{ENGINE}", '))
    return plan, site


def test_real_vllm_whose_kv_connector_fails_every_load_never_reads_reuse_from_it(tmp_path, vllm_python, model):
    plan, site = write_failing_connector_site(tmp_path, vllm_python, model)
    out = tmp_path / "out"
    p = cli("run", "--plan", str(plan), "--site", str(site), "--out", str(out))
    assert (out / "report.json").exists(), p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "report.json").read_text())
    failed = sum(f.read_text(errors="replace").count("failing connector: load of")
                 for f in (site.parent / "engine-logs").glob("engine-*.log"))
    assert failed > 0, "the connector was never asked to load: the test shows nothing"
    assert r["restoration"]["verified"], r["restoration"]
    # vLLM counted those tokens as loaded (external_kv_transfer, and in cached_tokens): the window reads
    # no host reuse from them, and its verdict is about the prefix cache alone
    assert all((c.get("host") or {}).get("reused_tokens") is None for c in r["cells"]), r["cells"]
    assert r["verdict"]["hypothesis"] in ("prefix_cache_churn", "not_reproduced", "no_prefix_reuse", "inconclusive")
    assert "host" not in r["verdict"]["basis"], r["verdict"]
    print(f"failing connector: {failed} loads failed; verdict basis: {r['verdict']['basis']}")
