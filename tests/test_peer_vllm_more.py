"""More of a real vLLM (0.32.0, the CPU build): a prefix cache that holds the replay (not reproduced),
site check and init-site against it, and its reasoning stream. Its own servers, so that a second test
worker runs them beside tests/test_peer_vllm.py."""

from __future__ import annotations

import json
import os

from tests.vllmtools import LARGE_BLOCKS, PLAN, SMALL_BLOCKS, _free_port, cell, cli, run_window, write_site


def test_real_vllm_with_a_prefix_cache_that_holds_the_replay_does_not_reproduce(tmp_path, vllm_python, model):
    rc, r, _out = run_window(tmp_path, vllm_python, model, LARGE_BLOCKS)
    assert (rc, r["outcome"]) == (0, "completed"), (r["outcome"], r.get("abort"), r["cells"])
    assert cell(r, "B.forward_replay")["gpu"]["reused_tokens"] > 0
    assert r["verdict"]["hypothesis"] == "not_reproduced", r["verdict"]
    assert r["restoration"]["verified"]


def test_site_check_on_real_vllm_without_a_connector_refuses_a_plan_whose_verdict_reads_the_host_tier(
        tmp_path, vllm_python, model):
    host_plan = PLAN.read_text().replace('tier = "gpu_prefix"', 'tier = "host"')
    plan, site = write_site(tmp_path, vllm_python, model, SMALL_BLOCKS, host_plan)
    p = cli("site", "check", str(site), "--plan", str(plan), "--json", timeout=600)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    check = json.loads(p.stdout)
    by_name = {c["name"]: c for c in check["capabilities"]}
    assert by_name["counter.host_reused_tokens"]["status"] == "not applicable"
    assert check["missing"] == ["counter.host_reused_tokens"]
    assert by_name["serving.model"]["status"] == "observable"
    assert by_name["counter.gpu_reused_tokens"]["status"] == "observable"


def test_real_vllm_reasoning_stream_is_read_as_reasoning_and_stamps_the_first_token(tmp_path, vllm_python, model):
    """vLLM streams a reasoning parser's output as `delta.reasoning` (its DeltaMessage): the client
    reads it as reasoning, stamps the first token at the first reasoning text, and hashes it into the
    answer. The tiny model has the think tokens and never writes `</think>` in its four greedy tokens,
    so with deepseek_r1's parser every token it writes is reasoning."""
    import anyio

    from flare_diag.daemon.hosts.fixture import find_fixture, load_fixture
    from flare_diag.daemon.hosts.site import load_site
    from flare_diag.daemon.hosts.target import Target

    _plan, site_path = write_site(tmp_path, vllm_python, model, SMALL_BLOCKS)
    text = site_path.read_text()
    site_path.write_text(text.replace('"--max-num-seqs", "16"]',
                                      '"--max-num-seqs", "16", "--reasoning-parser", "deepseek_r1"]', 1))
    fx = load_fixture(find_fixture("peer-30", []))

    async def one_request() -> dict:
        target = Target(load_site(site_path), {"peer-30": fx}, "0" * 64)
        try:
            await target.engine.prepare()
            return await target.send_request({"fixture": "peer-30", "body_index": 0})
        finally:
            await target.close()

    done = anyio.run(one_request)
    assert '"reasoning"' in done["response_head"], done["response_head"][:600]
    assert done["reasoning_only"] is True and done["visible_output"] is False, done
    assert done["first_token_ns"] is not None and done["first_token_ns"] <= done["last_token_ns"]
    assert done["completion_tokens"] == 4


def test_init_site_vllm_gives_a_profile_that_site_check_accepts_against_a_real_vllm_with_the_shipped_plan(
        tmp_path, vllm_python, model):
    """What `init-site vllm` writes, with only what an operator of vLLM's CPU build fills in (the
    environment's Python, the model, its served name, a free port, the CPU engine's settings, a token),
    passes `site check` against the real server with the shipped peer-vllm plan."""
    sites = tmp_path / "sites"
    p = cli("init-site", "vllm", str(sites), "--name", "cpu1", timeout=120)
    assert p.returncode == 0, p.stderr
    profile = sites / "cpu1.toml"
    cpu = ('"--dtype", "float32", "--max-model-len", "4096", "--enforce-eager", '
           '"--distributed-executor-backend", "uni", ')
    text = (profile.read_text()
            .replace("REPLACE-/path/to/vllm-venv/bin/python", str(vllm_python))
            .replace("REPLACE-model-name", "glm").replace("REPLACE-model-folder", str(model))
            .replace("http://127.0.0.1:8000", f"http://127.0.0.1:{_free_port()}")
            .replace('"--enable-prefix-caching",', cpu + '"--enable-prefix-caching",')
            .replace('env = { VLLM_NO_USAGE_STATS = "1" }', 'env = { VLLM_NO_USAGE_STATS = "1", VLLM_CPU_KVCACHE_SPACE = "1", '
                     'VLLM_ENABLE_V1_MULTIPROCESSING = "0", HF_HUB_OFFLINE = "1" }')
            .replace('source = "nvml"', 'source = "none"'))
    profile.write_text(text)
    (sites / "serving.token").write_text(os.urandom(12).hex())
    p = cli("site", "check", str(profile), "--plan", str(PLAN), "--json", timeout=900)
    check = json.loads(p.stdout)
    assert p.returncode == 0 and check["ready"], (check["missing"], p.stderr[-2000:])
    by_name = {c["name"]: c for c in check["capabilities"]}
    assert by_name["serving.model"]["status"] == "observable"
    assert by_name["counter.host_reused_tokens"]["status"] == "not applicable"
