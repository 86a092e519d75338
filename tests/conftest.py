"""Fixtures shared by the window tests that run against flaresim."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _cache_bytecode() -> None:
    """With PYTHONDONTWRITEBYTECODE set (as on the machines this is developed on), every process the
    suite starts (367 in a run: daemons, simulators, CLI calls, hosts) compiled this project's modules
    from source again: a daemon's and a simulator's imports took 1.06 s of CPU, 0.77 s with them cached.
    The bytecode goes to a cache folder outside the clone instead (the variable's intent: nothing
    written into the tree), as the llama.cpp build's does, for this process's later imports and every
    child's."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flare-diag" / "pycache"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return  # no writable cache: compile as before
    # the bytecode of the last run's temporary venvs and builds (test_install's) would only pile up
    shutil.rmtree(cache / Path(tempfile.gettempdir()).relative_to("/"), ignore_errors=True)
    del os.environ["PYTHONDONTWRITEBYTECODE"]  # so xdist's workers, started after this, skip all of it
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(cache))
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]
    sys.dont_write_bytecode = False


_cache_bytecode()

# The files that take longest on the wall clock, longest first (session 16, `-n 4 --dist loadfile` on two
# cores: test_steady_state waits 120 s on a real Prometheus's seconds at little CPU). xdist's own order
# (the files with most tests first) started the steady-state file at 236 s, and it ran alone for the
# last 47 s of a 356 s run. With `--no-loadscope-reorder` (pyproject's addopts) xdist hands files out
# in collection order, which this sets: these first, then the rest with most tests first, as xdist would.
LONG_FIRST = ("test_peer_vllm.py", "test_steady_state.py", "test_daemon_service.py", "test_fleet_daemon.py", "test_contract_host.py",
              "test_follow_on_chain.py", "test_rehearse_e2e.py", "test_peer_llamacpp.py", "test_install.py")


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    tests: dict[str, int] = {}
    for item in items:
        tests[item.path.name] = tests.get(item.path.name, 0) + 1
    # stable: a file's tests keep their order, and files of equal weight keep theirs
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -tests[item.path.name]))


@pytest.fixture(scope="session")
def small_plan(tmp_path_factory) -> Path:
    """The 2026-10-22 plan's shape on the eight-body tok1024 working set: whole windows in seconds."""
    text = (ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml").read_text()
    p = tmp_path_factory.mktemp("plan") / "fault-matrix.toml"
    p.write_text(text.replace('fixture = "c1-52"', 'fixture = "tok1024"')
                 .replace('name = "2026-10-22-cache-diagnosis"', 'name = "fault-matrix"'))
    return p


@pytest.fixture(scope="session")
def default_rehearsal(tmp_path_factory) -> tuple[int, dict, Path]:
    """`flare-diag rehearse` as the README runs it (the shipped plan, the default scenario, seed 0),
    in this process: (exit code, report.json, the out folder). Its users only read it, so under
    pytest-xdist the workers share one: the first to ask makes it while the others wait on a lock
    in the run's common temporary folder (a rehearsal is 12-14 s of a worker's time)."""
    import fcntl
    import json
    import os

    from tests.simtools import flare_diag_here
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "default-rehearsal"
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("default")
    out, made = root / "out", root / "exit-code"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():
            rc, stdout, stderr = flare_diag_here("rehearse", "--out", str(out))
            assert (out / "report.json").exists(), stdout[-2000:] + stderr[-2000:]
            made.write_text(str(rc))
        rc = int(made.read_text())
    return rc, json.loads((out / "report.json").read_text()), out


@pytest.fixture(scope="session")
def pg():
    """One throwaway PostgreSQL server for the session (tests/pgtools.py); each test takes a database of its own."""
    from tests.pgtools import PgServer
    server = PgServer()
    yield server
    server.remove()


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "slow: a long run (minutes to hours): run with FLARE_DIAG_SLOW=1")
    # the offline harness's validations (daemon/rehearsal/harness.py) are kept per test worker, not in the
    # user's ~/.cache: the windows of one worker's tests share them, as one operator's runs would
    os.environ["FLARE_DIAG_HARNESS_CACHE"] = tempfile.mkdtemp(prefix="flare-diag-test-harness-")


def pytest_runtest_setup(item) -> None:
    if "slow" in item.keywords and not os.environ.get("FLARE_DIAG_SLOW"):
        pytest.skip("a slow run: FLARE_DIAG_SLOW=1 runs it")


# A real vLLM (tests/vllmtools.py): one model a module that asks
VLLM_ENGINE = ROOT / "fixtures" / "engines" / "vllm"


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    p = subprocess.run(["bash", str(VLLM_ENGINE / "install.sh")], capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0, "installing vLLM failed:\n" + p.stderr[-3000:]
    return Path(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def model(tmp_path_factory, vllm_python) -> Path:
    out = tmp_path_factory.mktemp("vllm-model") / "tiny-llama"
    p = subprocess.run([str(vllm_python), str(VLLM_ENGINE / "make_model.py"), str(out)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return out
