"""The peer plan through the daemon against a real llama-server serving a tiny hybrid (LFM2) model.

The engine is built from the llama-cpp-python sdist's vendored llama.cpp (cached outside the clone;
a cold build took 4 minutes on two cores here) and the model is written here with `gguf`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flare_diag.daemon.hosts import rxstamps
from flare_diag.daemon.hosts.localengine import STOP_GRACE_S
from flare_diag.events.reader import LogReader

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "fixtures" / "engines" / "llamacpp"
PLAN = ROOT / "fixtures" / "plans" / "peer-llamacpp.toml"


@pytest.fixture(scope="module")
def llama_server() -> Path:
    p = subprocess.run(["bash", str(ENGINE / "build.sh")], capture_output=True, text=True, timeout=3600,
                       env={**os.environ, "PYTHON": sys.executable})
    assert p.returncode == 0, "building llama-server failed:\n" + p.stderr[-3000:]
    return Path(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from flare_diag.fixtures.engines.llamacpp.make_model import write
    return write(tmp_path_factory.mktemp("model") / "model.gguf")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_peer_site(tmp: Path, binary: Path, model: Path, cache_mib: int) -> tuple[Path, Path]:
    """A site profile for llama-server with a cache of `cache_mib`, and the peer plan to match it."""
    site_dir = tmp / "site"
    site_dir.mkdir()
    (site_dir / "model.gguf").symlink_to(model)
    (site_dir / "serving.token").write_text(os.urandom(12).hex())
    (site_dir / "site.toml").write_text((ENGINE / "site.template.toml").read_text().format(
        port=_free_port(), binary=binary, cache_mib=cache_mib))
    plan = tmp / "peer.toml"
    plan.write_text(PLAN.read_text().replace("host_cache_bytes = 4194304", f"host_cache_bytes = {cache_mib << 20}"))
    return plan, site_dir / "site.toml"


def run_peer(tmp: Path, binary: Path, model: Path, cache_mib: int) -> tuple[int, dict, Path]:
    plan, site = write_peer_site(tmp, binary, model, cache_mib)
    out = tmp / "out"
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "run", "--plan", str(plan), "--site", str(site),
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert (out / "report.json").exists(), p.stdout[-3000:] + p.stderr[-3000:]
    return p.returncode, json.loads((out / "report.json").read_text()), out


def _reused(r: dict, phase: str) -> int | None:
    return next(c["host"]["reused_tokens"] for c in r["cells"] if c["phase"] == phase)


@pytest.fixture(scope="module")
def small_cache_window(tmp_path_factory, llama_server, model) -> tuple[int, dict, Path]:
    """One window against llama-server with a 4 MiB host-RAM prompt cache: (exit code, report, out)."""
    return run_peer(tmp_path_factory.mktemp("small-cache"), llama_server, model, cache_mib=4)


def test_peer_engine_with_a_small_cache_shows_row_checkpoint_churn(small_cache_window):
    rc, r, out = small_cache_window
    assert (rc, r["outcome"]) == (0, "completed"), r["cells"]
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]
    assert {c["status"] for c in r["cells"]} == {"measured"}
    assert r["restoration"]["verified"] and r["restoration"]["incumbent_sha256_match"]
    # each request's host reuse (the counter delta around it) is the engine's own cached_tokens
    assert r["requests"] and all(q["delta"]["host_reused_tokens"] == q["cached_tokens"] for q in r["requests"])
    assert _reused(r, "B.forward_replay") == 0 and _reused(r, "A.forward_prime") == 0
    assert _reused(r, "A.reverse_replay") > 0 and _reused(r, "B.small_control") > 0
    assert r["verdict"]["hypothesis"] == "row_checkpoint_churn"
    # what llama.cpp does not expose is null, never zero or passed
    fwd = next(c for c in r["cells"] if c["phase"] == "A.forward_prime")
    assert fwd["host"]["lookups"] is None and fwd["host"]["hits"] is None and fwd["gpu"] == {"hits": None, "reused_tokens": None}
    assert r["restoration"]["containment"] is None and r["restoration"]["routed_preflight"] is None
    with LogReader(out / "log.db") as reader:
        assert reader.count() == r["integrity"]["events"]


def test_a_window_against_llama_server_times_every_first_token_by_the_kernels_receive_stamp(small_cache_window):
    _rc, r, _out = small_cache_window
    answered = [q for q in r["requests"] if q.get("first_token_ns") is not None]
    assert answered and {q["first_token_stamp"] for q in answered} == {"kernel" if rxstamps.supported() else "read"}
    assert sum(x["ttft_kernel_stamped"] + x["ttft_read_stamped"] for x in r["latency"]) == len(answered)


def test_the_reproducer_on_the_peer_engines_log_states_its_agreement_whatever_it_is(small_cache_window):
    _rc, r, out = small_cache_window
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "reproduce", str(out / "log.db"), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 1), p.stderr  # 1: the model does not reproduce this engine, and says so
    rep = json.loads(p.stdout)
    observed = [q for q in r["requests"] if q["delta"].get("host_reused_tokens") is not None]
    assert rep["compared"] == len(observed) > 0 and rep["observed_total"] == sum(q["delta"]["host_reused_tokens"] for q in observed)
    assert rep["reproduces"] == (rep["agreed"] == rep["compared"]) and (p.returncode == 0) == rep["reproduces"]
    assert "scenario" in rep["geometry_source"]  # llama.cpp exposes no row or page pools: the scenario's, said so
    print(f"reproducer on llama.cpp: {rep['agreed']}/{rep['compared']} requests agree; host reused predicted "
          f"{rep['predicted_total']}, observed {rep['observed_total']}")


def test_peer_engine_with_a_cache_that_holds_the_working_set_does_not_reproduce_through_flare_diagd(
        tmp_path, llama_server, model):
    from tests.daemontools import Daemon
    plan, site = write_peer_site(tmp_path, llama_server, model, cache_mib=256)
    d = Daemon(tmp_path, sites=site.parent).start()
    try:
        wid = _daemon_start(d, plan, site)
        w = d.cli("watch", timeout=600)
        assert w.returncode == 0, w.stdout[-2000:] + w.stderr[-2000:]
        r = _daemon_report(d, wid)
        engine_gone = _engines_stop(tmp_path)
    finally:
        d.stop()
    assert r["outcome"] == "completed" and r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]
    assert _reused(r, "B.forward_replay") > 0
    assert r["verdict"]["hypothesis"] == "not_reproduced"
    assert engine_gone


def _daemon_start(d, plan: Path, site: Path) -> str:
    p = d.cli("start", str(plan), "--site", site.stem)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1]


def _daemon_report(d, wid: str) -> dict:
    rep = d.cli("report", wid, "--format", "json")
    assert rep.returncode == 0, rep.stderr
    return json.loads(rep.stdout)


def _engines(tmp_path: Path) -> list[str]:
    """Command lines of the llama-servers this test's windows started (their model lives under tmp_path)."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "llama-server" in line and str(tmp_path) in line:
                out.append(line)
    return out


def _engines_stop(tmp_path: Path) -> bool:
    """Whether every engine the window started is gone within the stop grace period. The window's
    close is streamed before the daemon has finished stopping its engine (SIGTERM, then SIGKILL
    after the grace), so this waits for it, before the test kills the daemon."""
    end = time.monotonic() + STOP_GRACE_S + 10
    while _engines(tmp_path):
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def test_peer_engine_left_running_by_a_killed_daemon_is_stopped_and_the_incumbent_restored(tmp_path, llama_server, model):
    import signal

    from tests.daemontools import Daemon, in_phase
    plan, site = write_peer_site(tmp_path, llama_server, model, cache_mib=4)
    d = Daemon(tmp_path, sites=site.parent).start()
    try:
        wid = _daemon_start(d, plan, site)
        d.wait_for(in_phase, timeout=120, what="a phase with requests")
        orphans = _engines(tmp_path)
        assert len(orphans) == 1 and "--ctx-checkpoints" in orphans[0]  # the candidate is serving
        d.kill(signal.SIGKILL)
        d.start()
        st = d.wait_for(lambda s: s["state"] == "idle" and s["last_window"], timeout=180, what="the restore")
        r = _daemon_report(d, wid)
        engine_gone = _engines_stop(tmp_path)
    finally:
        d.stop()
    assert st["last_window"]["window_id"] == wid and r["abort"]["reason"] == "daemon_restart"
    assert r["restoration"]["verified"] and r["restoration"]["incumbent_sha256_match"]
    with LogReader(d.state / "log.db") as reader:
        notes = [ev.data.get("note") for e in reader.iter() if e.type == "action_done"
                 for ev in [e.event()] if isinstance(ev.data, dict) and ev.data.get("note")]
    assert notes and "left running by an earlier daemon" in notes[0]
    assert engine_gone


def test_a_llama_server_killed_mid_prime_aborts_engine_lost_not_malformed_transport_and_is_restored(
        tmp_path, llama_server, model):
    # SIGKILL to the candidate's process group as its prime starts (the OOM killer's way): whichever call meets
    # it first (a request, a read beside one) fails in transport, and /health then finds no one there
    import signal

    from tests.daemontools import run_acting_at
    plan, site = write_peer_site(tmp_path, llama_server, model, cache_mib=4)

    def kill() -> int:
        pid = int(next(tmp_path.rglob("engine.pid")).read_text())
        os.killpg(pid, signal.SIGKILL)
        return pid
    rc, r, _pid = run_acting_at(plan, site, tmp_path / "out", "phase A.forward_prime", kill)
    assert (rc, r["outcome"], r["abort"]["reason"]) == (1, "aborted", "engine_lost"), r["abort"]
    assert r["abort"]["detail"].endswith("; /health then could not be read (no connection)"), r["abort"]
    cells = {c["phase"]: c for c in r["cells"]}
    assert cells["A.forward_prime"]["status"] == "invalid" and "window aborted (engine_lost)" in cells["A.forward_prime"]["reason"]
    assert r["restoration"]["verified"] and r["restoration"]["incumbent_sha256_match"]
    assert r["verdict"]["hypothesis"] == "inconclusive"
    assert _engines_stop(tmp_path)


def test_a_llama_server_stopped_mid_prime_is_lost_within_its_bounds_not_waited_out(tmp_path, llama_server, model):
    # SIGSTOP to the candidate's process group as its prime starts (a process frozen whole: a debugger, a host
    # swapping): it holds every connection and answers nothing. Whichever call meets it first (a drain's scrape,
    # the identity watch, a request whose stream gives nothing) gets no answer within its bound, and /health then
    # none within its own. Before: the drain waited out its scrapes' 60 s, called its phase unsettled and the
    # window loaded B; a request met by it would have waited its 600 s
    import signal

    from tests.daemontools import run_acting_at
    plan, site = write_peer_site(tmp_path, llama_server, model, cache_mib=4)
    plan.write_text(plan.read_text().replace("[timing]\n", "[timing]\naction_timeout_s = 5\nstall_s = 5\n", 1))

    def stop() -> int:
        pid = int(next(tmp_path.rglob("engine.pid")).read_text())
        os.killpg(pid, signal.SIGSTOP)
        return pid
    rc, r, _pid = run_acting_at(plan, site, tmp_path / "out", "phase A.forward_prime", stop)
    assert (rc, r["outcome"], r["abort"] and r["abort"]["reason"]) == (1, "aborted", "engine_lost"), r["abort"]
    assert r["abort"]["detail"].endswith("; /health then could not be read (timeout)"), r["abort"]
    assert r["abort"]["minute"] is not None and r["abort"]["minute"] < 1, r["abort"]  # within its bounds, not 60 s
    cells = {c["phase"]: c for c in r["cells"]}
    assert cells["B.forward_prime"]["status"] == "failed", cells["B.forward_prime"]  # no other incarnation tried
    assert r["restoration"]["verified"] and r["restoration"]["incumbent_sha256_match"], r["restoration"]
    assert _engines_stop(tmp_path)


def test_site_check_passes_on_llama_server_with_the_peer_profile_and_leaves_no_engine(tmp_path, llama_server, model):
    plan, site = write_peer_site(tmp_path, llama_server, model, cache_mib=4)
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "site", "check", str(site), "--plan", str(plan), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    check = json.loads(p.stdout)
    by_name = {c["name"]: c["status"] for c in check["capabilities"]}
    # what llama.cpp does not have is said so, never passed
    assert by_name["router.backend"] == "not applicable" and by_name["counter.host_lookups"] == "not observable"
    assert by_name["drain.requests_active"] == "observable" and by_name["recipe.candidate"] == "observable"
    assert _engines_stop(tmp_path)


def _bodies_without_usage(beside: Path) -> Path:
    """The peer-30 fixture beside a plan, every body without its stream_options (its manifest's hashes anew)."""
    import hashlib
    src = ROOT / "fixtures" / "data" / "peer-30"
    out = beside / "peer-30"
    out.mkdir()
    bodies = []
    for line in (src / "bodies.jsonl").read_bytes().splitlines():
        body = json.loads(line)
        body.pop("stream_options")
        bodies.append(json.dumps(body, separators=(",", ":")).encode())
    (out / "bodies.jsonl").write_bytes(b"\n".join(bodies) + b"\n")
    manifest = json.loads((src / "manifest.json").read_text())
    manifest["sha256"] = [hashlib.sha256(b).hexdigest() for b in bodies]
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_llama_server_streams_no_usage_to_a_body_that_does_not_ask_so_its_answer_is_not_measured(
        tmp_path, llama_server, model):
    """What engine_profiles.USAGE_ONLY_WHEN_ASKED says of llama.cpp, on the real server: the same body without
    `stream_options.include_usage` gets an answer with no usage, which the window cannot measure."""
    import anyio

    from flare_diag.daemon.hosts.errors import ActionFailed
    from flare_diag.daemon.hosts.fixture import load_fixture
    from flare_diag.daemon.hosts.site import load_site
    from flare_diag.daemon.hosts.target import Target

    _plan, site = write_peer_site(tmp_path, llama_server, model, cache_mib=4)
    asks = load_fixture(ROOT / "fixtures" / "data" / "peer-30")
    bare = load_fixture(_bodies_without_usage(tmp_path))

    async def both() -> tuple[dict, str]:
        target = Target(load_site(site), {"asks": asks, "bare": bare}, "0" * 64)
        try:
            await target.engine.prepare()
            done = await target.send_request({"fixture": "asks", "body_index": 0})
            try:
                await target.send_request({"fixture": "bare", "body_index": 0})
            except ActionFailed as exc:
                return done, exc.detail
            return done, ""
        finally:
            await target.close()

    done, failed = anyio.run(both)
    assert done["prompt_tokens"] and done["completion_tokens"] is not None, done
    assert failed == "chat completion: no usage before [DONE]"
    assert _engines_stop(tmp_path)


def test_run_on_llama_server_refuses_bodies_that_do_not_ask_for_usage_before_anything_changes(tmp_path, llama_server, model):
    plan, site = write_peer_site(tmp_path, llama_server, model, cache_mib=4)
    _bodies_without_usage(plan.parent)  # found beside the plan before the built-in fixture of that name
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "site", "check", str(site), "--plan", str(plan), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    check = json.loads(p.stdout)
    assert p.returncode == 1 and check["missing"] == ["serving.usage"], (check["missing"], p.stderr[-2000:])
    usage = next(c for c in check["capabilities"] if c["name"] == "serving.usage")
    assert usage["reason"].startswith("fixture peer-30 body 0 (sha256 ") and "streams only when asked" in usage["reason"]
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "run", "--plan", str(plan), "--site", str(site),
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "serving.usage" in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "streams only when asked" in p.stderr, p.stderr[-2000:]  # the refusal says why, not only what
    assert not (out / "log.db").exists()  # nothing started: no window, no log
    assert _engines_stop(tmp_path)


def test_peer_engine_runs_the_output_consistency_phase_cold_then_with_its_prompt_cache(tmp_path, llama_server, model):
    plan, site = write_peer_site(tmp_path, llama_server, model, cache_mib=4)
    head = plan.read_text().split("[[phases]]", 1)[0].replace('name = "peer-llamacpp"', 'name = "peer-consistency"')
    plan.write_text(head + '[[phases]]\nid = "A.identity"\nincarnation = "A"\nkind = "identity"\nfresh = true\n\n'
                    '[[phases]]\nid = "A.output_consistency"\nincarnation = "A"\nkind = "consistency"\n'
                    'fixture = "peer-30"\ncomparable = false\n')
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "run", "--plan", str(plan), "--site", str(site),
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert (out / "report.json").exists(), p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "report.json").read_text())
    cell = next(c for c in r["cells"] if c["phase"] == "A.output_consistency")
    res = cell["consistency"]
    # every body answered twice and compared; the warm pass (newest first) met llama.cpp's prompt cache
    assert res["compared"] == 30 and res["reused_warm"] > 0, cell["reason"]
    # greedy decoding on one slot: a cached prompt must not change the answer
    assert res["consistent"] and cell["status"] == "measured", cell["reason"]
    assert r["restoration"]["verified"]
