"""The daemon's one door to flaresim: the simulated host, its scenarios, faults and cache model.

Every daemon module that needs the simulator imports it from here, so what the shell takes from the
fixtures is listed in one place. Each part loads when one of its names is first imported; the ASGI
host (starlette) and its server (uvicorn) are the `sim` extra, loaded only when a rehearsal serves one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what __getattr__ below hands out, for readers and type checkers
    from flare_diag.fixtures.flaresim.cache import TokenSeq
    from flare_diag.fixtures.flaresim.engine import Incarnation, render_prompt
    from flare_diag.fixtures.flaresim.faults import FAULT_KINDS, REQUEST_FAULTS
    from flare_diag.fixtures.flaresim.host import NUMERIC_PARAMS, RECIPES, STRING_PARAMS, Host, describe
    from flare_diag.fixtures.flaresim.metrics import families
    from flare_diag.fixtures.flaresim.replay import replay
    from flare_diag.fixtures.flaresim.scenario import Scenario, ScenarioError, list_scenarios, load_scenario
    from flare_diag.fixtures.flaresim.trace import (
        MOONCAKE_BLOCK, BlockLRU, TraceError, read_trace, run_block_lru, run_host_cache,
    )

# where each name lives: a module loads when one of its names is first asked for, so that a CLI call
# naming faults or scenarios in its help does not load the host and the cache model (a third of it)
_FROM = {
    "TokenSeq": "cache",
    "Incarnation": "engine", "render_prompt": "engine",
    "FAULT_KINDS": "faults", "REQUEST_FAULTS": "faults",
    "NUMERIC_PARAMS": "host", "RECIPES": "host", "STRING_PARAMS": "host", "Host": "host", "describe": "host",
    "families": "metrics",
    "replay": "replay",
    "Scenario": "scenario", "ScenarioError": "scenario", "list_scenarios": "scenario", "load_scenario": "scenario",
    "MOONCAKE_BLOCK": "trace", "BlockLRU": "trace", "TraceError": "trace", "read_trace": "trace",
    "run_block_lru": "trace", "run_host_cache": "trace",
}


def __getattr__(name: str):
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"flare_diag.fixtures.flaresim.{module}"), name)
    globals()[name] = value  # asked once
    return value


__all__ = [
    "FAULT_KINDS", "MOONCAKE_BLOCK", "NUMERIC_PARAMS", "RECIPES", "REQUEST_FAULTS", "STRING_PARAMS", "BlockLRU", "Host",
    "Incarnation", "Scenario", "ScenarioError", "TokenSeq", "TraceError", "build_app", "chunk_tokens", "describe",
    "families", "list_scenarios", "load_scenario", "read_trace", "render_prompt", "replay", "run_block_lru",
    "run_host_cache", "serve",
]


def build_app(host: Host, *args, **kwargs):
    """flaresim's ASGI app over `host` (needs the `sim` extra)."""
    from flare_diag.fixtures.flaresim.app import build_app as build
    return build(host, *args, **kwargs)


def chunk_tokens() -> int:
    """Tokens per streamed chunk, as flaresim's host sends them (a model run streams the same way)."""
    from flare_diag.fixtures.flaresim.app import CHUNK_TOKENS
    return CHUNK_TOKENS


def serve(argv: list[str]) -> int:
    """`flare-diag sim serve`: flaresim as a process of its own (needs the `sim` extra)."""
    from flare_diag.fixtures.flaresim.serve import main
    return main(argv)
