"""The daemon's one door to flaresim: the simulated host, its scenarios, faults and cache model.

Every daemon module that needs the simulator imports it from here, so what the shell takes from the
fixtures is listed in one place. The model parts load with this module; the ASGI host (starlette) and
its server (uvicorn) are the `sim` extra, loaded only when a rehearsal serves one.
"""

from __future__ import annotations

from flare_diag.fixtures.flaresim.cache import TokenSeq
from flare_diag.fixtures.flaresim.engine import Incarnation, render_prompt
from flare_diag.fixtures.flaresim.host import (
    FAULT_KINDS, NUMERIC_PARAMS, RECIPES, REQUEST_FAULTS, STRING_PARAMS, Host, describe,
)
from flare_diag.fixtures.flaresim.metrics import families
from flare_diag.fixtures.flaresim.replay import replay
from flare_diag.fixtures.flaresim.scenario import Scenario, ScenarioError, list_scenarios, load_scenario
from flare_diag.fixtures.flaresim.trace import (
    MOONCAKE_BLOCK, BlockLRU, TraceError, read_trace, run_block_lru, run_host_cache,
)

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
