"""The seed's method through `run` against a real vLLM (0.32.0, the CPU build) serving a tiny Llama: a
prefix cache smaller than the replay (churn), what the window reads from it, the fit that recovers its
size, and a KV connector whose every load fails. The daemon runs the engine itself (site profile
`[engine] kind = "vllm"`); with no KV connector the engine has no host tier, so the plan's verdict reads
the GPU prefix cache, sized in 128-token blocks. Then a cache that holds the replay, site check and
init-site against the real server, its reasoning stream, and a request that reaches it around the window. One file: two modules' servers side by side
on two cores made the suite slower (1,094 s against 962 s), not faster."""

from __future__ import annotations

import json
import tomllib
import os
from pathlib import Path

import pytest
import tomli_w

from flare_diag.daemon.hosts import rxstamps
from flare_diag.events.reader import LogReader
from tests.vllmtools import ENGINE, LARGE_BLOCKS, PLAN, SMALL_BLOCKS, _free_port, cell, cli, run_window, write_site


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


def test_real_vllm_reports_each_phases_queue_wait_and_prefill_from_its_own_request_histograms(small_cache_window):
    _rc, r, _out = small_cache_window
    prime = next(c for c in r["costs"] if c["phase"] == "A.forward_prime")
    assert prime["engine_queue_s_p50"] is not None and prime["engine_queue_s_p50"] >= 0
    assert prime["engine_prefill_s_p50"] is not None and 0 < prime["engine_prefill_s_p50"] <= prime["ttft_s_p50"]


def test_real_vllm_resident_memory_is_the_whole_engine_process_group(small_cache_window):
    _rc, _r, out = small_cache_window
    with LogReader(out / "log.db") as reader:
        resident = [ev.data["gauges"]["resident_bytes"] for e in reader.iter() if e.type == "action_done"
                    for ev in [e.event()] if isinstance(ev.data, dict) and "gauges" in ev.data]
    seen = [v for v in resident if v is not None]
    # the API server alone holds about 0.7 GiB; with its engine core, worker and 1 GiB of KV cache, more
    assert seen and min(seen) > 1 << 30, seen[:5]


def test_real_vllm_answers_name_the_model_its_identity_serves_so_each_answer_witnesses_it(small_cache_window):
    """vLLM's chunks carry the served model's name (engine_profiles.ANSWER_NAMES_SERVED_MODEL), the name its
    /v1/models lists first, which the identity reports: each recorded answer is held to it, and no answer
    of the real engine trips the check."""
    _rc, _r, out = small_cache_window
    with LogReader(out / "log.db") as reader:
        events = [e.event() for e in reader.iter(types=["action_requested", "action_done", "request_done"])]
    reads = {ev.action_id for ev in events if type(ev).__name__ == "ActionRequested" and ev.action == "read_identity"}
    served = {ev.data["model"] for ev in events if type(ev).__name__ == "ActionDone" and ev.action_id in reads and ev.ok}
    answers = [ev for ev in events if type(ev).__name__ == "RequestDone" and ev.outcome == "ok"]
    assert len(served) == 1 and answers, served
    assert {(ev.model_asked, ev.model_answered) for ev in answers} == {(served.pop(),) * 2}


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
    for the connector count failed loads too, so host reuse is not observable). Its store is a folder on
    disk, which outlives every incarnation: A's reverse replay asks the connector for every body the 64
    blocks lost, and B's first request finds what A stored there, so B's prime stops at it (B costs a
    load and one request, not the minute and a half its replays would)."""
    config = json.dumps({"kv_connector": "FailingLoadConnector", "kv_connector_module_path": "failing_connector",
                         "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                         "kv_connector_extra_config": {"shared_storage_path": str(tmp / "kv-store")}})
    plan_data = tomllib.loads(PLAN.read_text())
    plan_data["identity"].pop("host_cache_bytes")
    text = tomli_w.dumps(plan_data)
    plan, site = write_site(tmp, python, model, SMALL_BLOCKS, text)
    profile = site.read_text()
    for seqs in ("16", "8"):
        profile = profile.replace(f'"--max-num-seqs", "{seqs}"]', f'"--max-num-seqs", "{seqs}", "--kv-transfer-config", \'{config}\']')
    site.write_text(profile.replace("env = { ", f'env = {{ PYTHONPATH = "{ENGINE}", '))
    return plan, site


@pytest.fixture(scope="module")
def failing_connector_window(tmp_path_factory, vllm_python, model) -> tuple[dict, Path]:
    """One window against vLLM with that connector: (report, the site profile)."""
    tmp = tmp_path_factory.mktemp("failing-connector")
    plan, site = write_failing_connector_site(tmp, vllm_python, model)
    out = tmp / "out"
    p = cli("run", "--plan", str(plan), "--site", str(site), "--out", str(out))
    assert (out / "report.json").exists(), p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads((out / "report.json").read_text()), site


def test_real_vllm_whose_kv_connector_fails_every_load_never_reads_reuse_from_it(failing_connector_window):
    r, site = failing_connector_window
    failed = sum(f.read_text(errors="replace").count("failing connector: load of")
                 for f in (site.parent / "engine-logs").glob("engine-*.log"))
    assert failed > 0, "the connector was never asked to load: the test shows nothing"
    assert r["restoration"]["verified"], r["restoration"]
    # vLLM counted those tokens as loaded (external_kv_transfer, and in cached_tokens): the window reads
    # no host reuse from them, and its verdict is about the prefix cache alone
    assert all((c.get("host") or {}).get("reused_tokens") is None for c in r["cells"]), r["cells"]
    assert r["verdict"]["hypothesis"] in ("prefix_cache_churn", "not_reproduced", "no_prefix_reuse", "inconclusive")
    assert "host reused" not in r["verdict"]["basis"] and "host tokens" not in r["verdict"]["basis"], r["verdict"]
    print(f"failing connector: {failed} loads failed; verdict basis: {r['verdict']['basis']}")


def test_real_vllm_whose_connector_store_outlives_the_engine_measures_nothing_on_the_incarnation_that_finds_it(
        failing_connector_window):
    """The store is a folder on disk: B, loaded fresh (counters at zero), finds at its first request what A put
    there. vLLM maps no host reuse; what the connector found is its external_prefix_cache_hits."""
    r, _site = failing_connector_window
    cells = {c["phase"]: c for c in r["cells"]}
    assert cells["A.forward_prime"]["status"] == "measured", cells["A.forward_prime"]
    prime = cells["B.forward_prime"]
    assert (prime["status"], prime["requests"]) == ("invalid", 1), prime
    assert "(#0: 1,024 tokens found in a cache outside the engine)" in prime["reason"], prime  # vLLM has no host hits to say
    assert cells["B.forward_replay"]["status"] == "invalid" and cells["B.forward_replay"]["not_fresh"]
    assert cells["B.forward_replay"]["requests"] == 0 and r["restoration"]["verified"]


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
    assert done["first_token_stamp"] == ("kernel" if rxstamps.supported() else "read")  # over loopback, as it came
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
    assert by_name["serving.usage"]["status"] == "observable" and by_name["serving.cached_tokens"]["status"] == "observable"


def test_a_request_that_reaches_the_real_vllm_around_the_window_aborts_containment(tmp_path, vllm_python, model):
    # a client that kept the engine's own address sends one request while A's reverse replay runs: vLLM's
    # request_success counts it beside the window's own, and nothing the router could show says so
    import sqlite3
    import threading
    import time

    import httpx
    plan, site = write_site(tmp_path, vllm_python, model, LARGE_BLOCKS)
    url = tomllib.loads(site.read_text())["serving"]["url"]
    token = (site.parent / "serving.token").read_text().strip()
    out, sent = tmp_path / "out", threading.Event()

    def stray() -> None:
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline and not sent.is_set():
            time.sleep(0.2)
            try:
                with sqlite3.connect(f"file:{out / 'log.db'}?mode=ro", uri=True) as db:
                    seen = db.execute("SELECT 1 FROM events WHERE type = 'action_requested' AND "
                                      "instr(payload, ?) > 0 LIMIT 1", (b'"phase":"A.reverse_replay"',)).fetchone()
            except sqlite3.Error:
                continue  # not written yet
            if seen:
                httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {token}"}, timeout=120,
                           json={"model": "glm", "messages": [{"role": "user", "content": "hello from elsewhere"}],
                                 "max_tokens": 4})
                sent.set()
    thread = threading.Thread(target=stray, daemon=True)
    thread.start()
    p = cli("run", "--plan", str(plan), "--site", str(site), "--out", str(out))
    thread.join(timeout=5)
    assert sent.is_set(), "the stray request was never sent: the test shows nothing"
    assert (out / "report.json").exists(), p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "report.json").read_text())
    assert r["abort"]["reason"] == "containment" and "requests from outside the window" in r["abort"]["detail"], r["abort"]
    assert cell(r, "A.reverse_replay")["status"] == "invalid" and r["restoration"]["verified"], r["restoration"]
    assert r["verdict"]["hypothesis"] == "inconclusive"


def _engine_core(pgid: int) -> list[int]:
    """The pids of vLLM's EngineCore in the engine's process group (it names itself VLLM::EngineCore)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[2]) == pgid and b"EngineCore" in cmd:
            out.append(int(pid))
    return out


def _signal_core_mid_prime(tmp_path: Path, vllm_python: Path, model: Path, sig: int, stall_s: float | None = None,
                           ) -> tuple[int, dict, Path]:
    """`run` of the peer plan on vLLM, `sig` sent to its EngineCore a second into A.forward_prime (a request or
    two in: it meets one in flight or the next one sent): (exit code, report, out folder)."""
    import time

    from tests.daemontools import run_acting_at
    plan, site = write_site(tmp_path, vllm_python, model, LARGE_BLOCKS)
    if stall_s is not None:
        plan.write_text(plan.read_text().replace("[timing]\n", f"[timing]\nstall_s = {stall_s:g}\n", 1))
    out = tmp_path / "out"

    def send() -> list[int]:
        time.sleep(1.0)
        core = _engine_core(int(next(tmp_path.rglob("engine.pid")).read_text()))
        for pid in core:
            os.kill(pid, sig)
        return core
    rc, r, signalled = run_acting_at(plan, site, out, "phase A.forward_prime", send)
    assert signalled, "no EngineCore was found in the engine's process group: the test shows nothing"
    return rc, r, out


def _failed_requests(out: Path) -> list:
    with LogReader(out / "log.db") as reader:
        return [ev for e in reader.iter(types=["request_done"]) for ev in [e.event()] if ev.outcome == "error"]


def test_a_real_vllm_whose_engine_core_is_killed_mid_prime_aborts_engine_lost_at_its_first_failed_request(
        tmp_path, vllm_python, model):
    # the OOM killer's pick: the EngineCore (it holds the model and the KV cache), not the API server, which
    # answers HTTP 500 for a while after, its /health 503 (EngineDeadError); the window used to go on sending
    # the phase's requests into it, and named a broken transport once the server had gone
    import signal
    rc, r, out = _signal_core_mid_prime(tmp_path, vllm_python, model, signal.SIGKILL)
    assert (rc, r["abort"] and r["abort"]["reason"]) == (1, "engine_lost"), r["abort"]
    assert "/health" in r["abort"]["detail"], r["abort"]
    failed = _failed_requests(out)
    assert len(failed) <= 1, [(ev.error, ev.detail) for ev in failed]  # nothing more sent into a dead engine
    assert cell(r, "A.forward_prime")["status"] == "invalid" and r["restoration"]["verified"], r["restoration"]


def test_a_real_vllm_whose_engine_core_hangs_mid_prime_aborts_engine_stalled_at_the_stall_bound(
        tmp_path, vllm_python, model):
    # SIGSTOP to the EngineCore (a hung collective, as a rank stuck in NCCL looks from outside): the API server
    # still answers /health 200 (its check_health asks only whether the core died: vllm/v1/engine/async_llm.py),
    # /metrics and /v1/models; only the request's stream gives nothing. Before the stall bound, the request
    # waited its 600 s deadline, and the phase then sent the next into the same core
    import signal
    rc, r, out = _signal_core_mid_prime(tmp_path, vllm_python, model, signal.SIGSTOP, stall_s=15)
    assert (rc, r["abort"] and r["abort"]["reason"]) == (1, "engine_stalled"), r["abort"]
    assert r["abort"]["detail"].endswith("; /health then answered 200"), r["abort"]
    assert "no event for 15 s (timing.stall_s)" in r["abort"]["detail"], r["abort"]
    assert [ev.error for ev in _failed_requests(out)] == ["stalled"]  # nothing more sent into the stopped core
    assert cell(r, "A.forward_prime")["status"] == "invalid" and r["restoration"]["verified"], r["restoration"]
