"""Helpers for flaresim tests: fixture bodies and an in-process client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from flare_diag.fixtures.flaresim.app import build_app
from flare_diag.fixtures.flaresim.host import Host
from flare_diag.daemon.hosts.site import Site
from flare_diag.fixtures.flaresim.scenario import load_scenario

DATA = Path(__file__).resolve().parent.parent / "fixtures" / "data"
AUTH = {"Authorization": "Bearer sim-token"}


def bodies(name: str = "c1-52") -> list[bytes]:
    return [line.rstrip(b"\n") for line in (DATA / name / "bodies.jsonl").open("rb")]


def parsed(name: str = "c1-52") -> list[dict]:
    return [json.loads(b) for b in bodies(name)]


def client(scenario: str = "flare-47581cca", time_scale: float = 1e6) -> tuple[Host, httpx.AsyncClient]:
    host = Host(load_scenario(scenario), time_scale=time_scale)
    return host, httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(host)), base_url="http://sim")


SIM_TOKEN = "sim-token-for-tests"


@asynccontextmanager
async def served(scenario: str = "flare-47581cca", seed: int = 0) -> AsyncIterator[tuple[Host, Site]]:
    """flaresim served in this process as a rehearsal serves it (on a VirtualTimeLoop its clock is
    virtual), with the site that reaches it."""
    from flare_diag.daemon.rehearsal.rehearse import served_flaresim
    async with served_flaresim(scenario, SIM_TOKEN, seed=seed) as (host, site):
        yield host, site  # type: ignore[misc]


def flare_diag_here(*args: str, columns: int = 200) -> tuple[int, str, str]:
    """`flare-diag ARGS` in this process (a rehearsal needs no process of its own now that its
    simulator is served in-process): exit code, stdout, stderr."""
    import contextlib
    import io
    import os

    import gc

    from flare_diag.daemon.cli.commands import main
    gc.freeze()  # what the test session holds is not garbage: full collections need not walk it again
    out, err = io.StringIO(), io.StringIO()
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)  # rich lays out for this width when not on a terminal
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(list(args))
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return rc, out.getvalue(), err.getvalue()
