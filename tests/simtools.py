"""Helpers for flaresim tests: fixture bodies and an in-process client."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from fixtures.flaresim.app import build_app
from fixtures.flaresim.host import Host
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
