"""Fixtures shared by the window tests that run against flaresim."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
