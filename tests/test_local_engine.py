"""The local-engine lifecycle around a daemon that dies: orphans stopped, taken ports refused.

The engine here is a stand-in process (tests/fake_engine.py) answering /health and /props, so these
run without building llama.cpp; tests/test_peer_llamacpp.py drives the real one.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from flare_diag.daemon.hosts.errors import ActionFailed
from flare_diag.daemon.hosts.localengine import PIDFILE, LocalEngine, LocalRecipe

FAKE = Path(__file__).resolve().parent / "fake_engine.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _engine(tmp_path: Path, port: int, *extra: str) -> LocalEngine:
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")
    recipe = LocalRecipe("incumbent", [str(FAKE), "--host", "{host}", "--port", "{port}", *extra], model)
    return LocalEngine(Path(sys.executable), {"incumbent": recipe}, "incumbent", f"http://127.0.0.1:{port}",
                       None, tmp_path / "engine-logs", load_timeout_s=20)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _orphan(argv: list[str]) -> int:
    """A process in its own session whose parent has already exited, as a killed daemon leaves its engine."""
    code = f"import subprocess; print(subprocess.Popen({argv!r}, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def _serving_orphan() -> tuple[int, int]:
    """(port, pid) of a stand-in engine left running as a killed daemon leaves it, once it answers: a port another
    test took between `_free_port` and the engine's bind (both cores busy, five workers) makes it exit, and
    then another port is tried."""
    for _ in range(5):
        port = _free_port()
        pid = _orphan([sys.executable, str(FAKE), "--host", "127.0.0.1", "--port", str(port)])
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return port, pid
            time.sleep(0.05)
    raise AssertionError("no stand-in engine came up on a free port")


async def test_an_engine_left_running_by_a_killed_daemon_is_stopped_before_the_incumbent_starts(tmp_path):
    port, orphan = _serving_orphan()
    (tmp_path / "engine-logs").mkdir()
    (tmp_path / "engine-logs" / PIDFILE).write_text(f"{orphan}\n")
    eng = _engine(tmp_path, port)
    try:
        state = await eng.state()
        assert state["loaded"]["recipe"] == "incumbent" and str(orphan) in state["note"]
        assert not _alive(orphan) and _alive(eng.proc.pid)
        assert (tmp_path / "engine-logs" / PIDFILE).read_text().strip() == str(eng.proc.pid)
    finally:
        await eng.close()
    assert not (tmp_path / "engine-logs" / PIDFILE).exists()


async def test_no_engine_is_started_on_a_port_another_process_listens_on(tmp_path):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        eng = _engine(tmp_path, other.getsockname()[1])
        try:
            with pytest.raises(ActionFailed, match="already taken by another process"):
                await eng.state()
            assert eng.proc is None and not (tmp_path / "engine-logs" / PIDFILE).exists()
        finally:
            await eng.close()


async def test_a_pidfile_naming_a_process_that_is_not_our_engine_leaves_that_process_alone(tmp_path):
    stranger = _orphan(["sleep", "60"])
    try:
        (tmp_path / "engine-logs").mkdir()
        (tmp_path / "engine-logs" / PIDFILE).write_text(f"{stranger}\n")
        eng = _engine(tmp_path, _free_port())
        try:
            state = await eng.state()
            assert state["loaded"] is not None and "note" not in state
            assert _alive(stranger)
        finally:
            await eng.close()
    finally:
        os.kill(stranger, signal.SIGKILL)


async def test_an_engine_log_folder_that_cannot_be_made_fails_the_load_naming_the_folder(tmp_path):
    eng = _engine(tmp_path, _free_port())
    (tmp_path / "blocker").write_text("a file, not a folder")
    eng.log_dir = tmp_path / "blocker" / "engine-logs"
    try:
        with pytest.raises(ActionFailed, match="engine log folder .*blocker/engine-logs.*log_dir"):
            await eng.state()
        assert eng.proc is None
    finally:
        await eng.close()


async def test_reads_of_an_engine_that_closes_kept_connections_as_the_next_request_arrives_are_answered(tmp_path):
    """An engine's HTTP server closes an idle kept connection when it likes (uvicorn after 5 s; a
    restarted engine has closed them all): no read of the engine goes out on one it may have closed."""
    eng = _engine(tmp_path, _free_port(), "--drop-kept-connections")
    try:
        await eng.state()  # started, and its /health polled until it answered
        first = await eng.identity({})
        again = await eng.identity({})
        assert first["build_info"] == again["build_info"] == "fake"
    finally:
        await eng.close()


async def test_an_engine_that_never_becomes_healthy_fails_its_load_and_is_stopped_whole(tmp_path):
    """A load that hangs (a model read stuck on a mount) fails at the site's load_timeout_s, and the
    process is stopped: nothing is left starting on the host for the next load to land beside."""
    port = _free_port()
    eng = _engine(tmp_path, port, "--never-healthy")
    eng.load_timeout_s = 2
    try:
        with pytest.raises(ActionFailed, match="engine incumbent was not healthy within 2 s") as failed:
            await eng.load("incumbent", (await eng.recipe("incumbent"))["sha256"])
        assert failed.value.error == "load_failed"
        assert eng.proc is None and eng.loaded is None and not (tmp_path / "engine-logs" / PIDFILE).exists()
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the polls' closed connections linger
            s.bind(("127.0.0.1", port))  # refused while anything still listens on it: the engine is gone
    finally:
        await eng.close()


async def test_a_load_its_caller_gave_up_on_shows_busy_and_the_next_load_stops_it_first(tmp_path):
    """The window's load deadline can pass before the site's own: the engine is still starting, and the
    manager's state must not read as a host at rest (the window would load the candidate over it)."""
    port = _free_port()
    eng = _engine(tmp_path, port)
    argv = [str(FAKE), "--host", "{host}", "--port", "{port}", "--never-healthy"]
    eng.recipes["candidate"] = LocalRecipe("candidate", argv, tmp_path / "model.bin")
    try:
        await eng.state()  # the incumbent, started and healthy
        sha = {n: (await eng.recipe(n))["sha256"] for n in ("incumbent", "candidate")}
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(eng.load("candidate", sha["candidate"]), 2)  # the engine's own bound is 20 s
        left = eng.proc
        assert left is not None and left.returncode is None
        assert await eng.state() == {"loaded": None, "busy": True}
        await eng.load("incumbent", sha["incumbent"])
        assert left.returncode is not None
        assert (await eng.state())["loaded"]["recipe"] == "incumbent"
    finally:
        await eng.close()


async def test_a_model_read_that_never_returns_shows_busy_after_its_load_was_given_up_on(tmp_path):
    """A model on a mount that stopped answering: the load's sha256 check blocks on its read for good. The
    caller gives up at its deadline; the manager's state must not read as a host at rest meanwhile."""
    eng = _engine(tmp_path, _free_port())
    model = tmp_path / "stuck-model.bin"
    model.write_bytes(b"weights")
    eng.recipes["candidate"] = LocalRecipe("candidate", [str(FAKE), "--host", "{host}", "--port", "{port}"], model)
    try:
        await eng.state()
        sha = (await eng.recipe("candidate"))["sha256"]
        await eng.unload("incumbent", (await eng.recipe("incumbent"))["sha256"])
        model.unlink()
        os.mkfifo(model)  # opening it for reading blocks until a writer comes: a read that never returns
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(eng.load("candidate", sha), 2)
        assert await eng.state() == {"loaded": None, "busy": True}
        await asyncio.to_thread(model.write_bytes, b"")  # the mount answers again: the read ends (empty: the check fails)
        with anyio.fail_after(30):
            while (await eng.state())["busy"]:
                await asyncio.sleep(0.05)
    finally:
        await eng.close()


def test_run_on_a_site_whose_incumbent_engine_exits_as_it_starts_refuses_in_one_line(tmp_path):
    # the site check's start of the incumbent raised past it, and `run` printed a traceback at the operator
    root = Path(__file__).resolve().parent.parent
    site = tmp_path / "site"
    site.mkdir()
    (site / "model.gguf").write_bytes(b"weights")
    (site / "serving.token").write_text(os.urandom(12).hex())
    engine = tmp_path / "llama-server"  # says why in its own words, as llama-server does, and exits
    engine.write_text("#!/bin/sh\necho 'starting'\necho 'error: failed to load model' >&2\nexit 1\n")
    engine.chmod(0o755)
    (site / "site.toml").write_text((root / "fixtures" / "engines" / "llamacpp" / "site.template.toml").read_text().format(
        port=_free_port(), binary=engine, cache_mib=4))
    plan = root / "fixtures" / "plans" / "peer-llamacpp.toml"
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "run", "--plan", str(plan), "--site",
                        str(site / "site.toml"), "--out", str(out)], cwd=root, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr[-2000:]
    assert "serving.health" in p.stderr and "error: failed to load model" in p.stderr, p.stderr  # the why, in its line
    assert not (out / "log.db").exists()
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "site", "check", str(site / "site.toml"), "--json"],
                       cwd=root, capture_output=True, text=True, timeout=120)
    health = next(c for c in json.loads(p.stdout)["capabilities"] if c["name"] == "serving.health")
    assert p.returncode == 1 and health["reason"].startswith("the site's incumbent could not be started: engine "
                                                             "incumbent exited with status 1 while loading; its log "), health
    assert health["reason"].endswith("-incumbent.log ends: error: failed to load model"), health
