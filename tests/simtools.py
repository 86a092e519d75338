"""Helpers for flaresim tests: fixture bodies and an in-process client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from fixtures.flaresim.app import build_app
from fixtures.flaresim.host import Host
from daemon.site import Site
from fixtures.flaresim.scenario import load_scenario

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
    from daemon.inprocess import serve_in_process
    from daemon.rehearse import SIM_URL
    from daemon.site import sim_site
    host = Host(load_scenario(scenario), token=SIM_TOKEN, clock=asyncio.get_running_loop().time, seed=seed)
    async with serve_in_process(build_app(host)) as transport:
        yield host, sim_site(SIM_URL, SIM_TOKEN, transport=transport)
