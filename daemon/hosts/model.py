"""The host model as one more adapter set: flaresim's host (its incarnations, host cache and keyed service
noise) behind the same five ports as a site over HTTP, in virtual time. A port that takes time awaits
`At(ns)`, which the model run's scheduler (daemon/rehearsal/modelrun.py) resumes at that moment; the
answers are what the HTTP adapters would read from the simulator's API. No HTTP, no bytes of answers:
a model run is a forecast's sample, never evidence."""

from __future__ import annotations

import hashlib
import base64
import json
from collections.abc import Callable, Generator
from typing import Any

import httpx
from prometheus_client.samples import Sample

from flare_diag.daemon.hosts import metrics
from flare_diag.daemon.hosts.errors import ActionFailed, classify_response
from flare_diag.daemon.hosts.host import Host

S = 1_000_000_000
_PARSED: dict[bytes, dict] = {}


class At:
    """What a model port awaits: resume me when the window clock reads `ns`."""

    __slots__ = ("ns",)

    def __init__(self, ns: int) -> None:
        self.ns = ns

    def __await__(self) -> Generator[At, None, None]:
        yield self


def _http(status: int, etype: str, message: str, what: str) -> ActionFailed:
    """The failure the HTTP adapters would raise on the simulator's error answer."""
    return classify_response(httpx.Response(status, json={"error": {"type": etype, "message": message}}), what)


class ModelManager:
    """contract section 1's recipe manager, as flaresim's host carries out loads and unloads."""

    def __init__(self, sim: Any, now: Callable[[], int]) -> None:
        self.sim, self.now = sim, now

    async def prepare(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def loaded(self) -> dict | None:
        e = self.sim.engine
        return {"recipe": e.recipe, "sha256": e.recipe_sha256, "incarnation": e.incarnation} if e else None

    async def state(self) -> dict:
        return {"loaded": self.loaded(), "busy": self.sim.busy}

    async def recipe(self, name: str) -> dict:
        if name not in self.sim.recipes:
            raise _http(404, "not_found", f"no recipe {name!r}", f"recipe {name}")
        content = self.sim.recipes[name]
        return {"name": name, "sha256": hashlib.sha256(content).hexdigest(),
                "content_b64": base64.b64encode(content).decode()}

    async def preview(self, op: str, name: str, sha256: str | None) -> dict:
        if name not in self.sim.recipes:
            raise _http(404, "not_found", f"no recipe {name!r}", "preview")
        if sha256 not in (None, self.sim.sha(name)):
            raise _http(409, "conflict", "sha256 does not match the stored bytes", "preview")
        steps = ["drain", "stop engine", "release GPUs"] if op == "unload" else \
            ["verify recipe bytes", "start engine", "warm up", "ready"]
        return {"ok": True, "steps": steps}

    def _checked(self, name: str, sha256: str, what: str) -> None:
        if name not in self.sim.recipes:
            raise _http(404, "not_found", f"no recipe {name!r}", what)
        if sha256 != self.sim.sha(name):
            raise _http(409, "conflict", f"sha256 does not match the stored bytes of {name!r}", what)

    async def unload(self, name: str, sha256: str) -> dict:
        self._checked(name, sha256, "unload")
        e = self.sim.engine
        if e is not None and e.recipe_sha256 != sha256:
            raise _http(409, "conflict", "that recipe is not the one loaded", "unload")
        self.sim.busy = True
        await At(self.now() + int(5 * self.sim.unload_noise() * S))
        self.sim.unload()
        self.sim.busy = False
        return {"ok": True}

    async def load(self, name: str, sha256: str) -> dict:
        self._checked(name, sha256, "load")
        self.sim.busy = True
        await At(self.now() + int(self.sim.sc.load_s * self.sim.load_noise() * S))
        incarnation = self.sim.load(name).incarnation
        self.sim.busy = False
        return {"incarnation": incarnation}


class ModelServing:
    """The engine: identity, trace, health, metrics as the exposition reads, and generations paced as
    flaresim's chat handler paces them (restore, prefill, then decode chunk by chunk)."""

    trace_switch = True

    def __init__(self, sim: Any, now: Callable[[], int], chunk: int) -> None:
        self.sim, self.now, self.chunk = sim, now, chunk

    async def identity(self) -> dict:
        return self.sim.identity()

    async def trace(self, enabled: bool) -> dict:
        if self.sim.engine is None:
            raise _http(503, "unavailable", "no incarnation loaded", "trace")
        self.sim.engine.trace_enabled = bool(enabled)
        return self.sim.identity()

    async def health(self) -> dict:
        return {"status": 200 if self.sim.engine else 503}

    async def metrics(self) -> dict:
        return scraped(self.sim)

    async def models(self) -> list[str] | None:
        return None  # the preflight names the fixtures' model, or none

    async def openapi(self) -> dict | None:
        return None

    async def chat(self, body: bytes) -> dict:
        t0 = self.now()
        p = await self.generate(body, "chat completion", routed=False)
        restore_prefill = int(p.restore_s * S) + int(p.prefill_s * S)
        first = restore_prefill + int(p.decode_s / max(p.gen.total, 1) * min(self.chunk, p.gen.total) * S)
        end = self.now() - t0
        return {"outcome": "ok", "request_id": None, "status_code": 200,  # the policy reads neither id nor bytes
                "finish_reason": p.gen.finish_reason, "visible_output": p.gen.content_tokens > 0,
                "reasoning_only": p.gen.reasoning_tokens > 0 and p.gen.content_tokens == 0,
                "prompt_tokens": p.prompt_len, "completion_tokens": p.gen.total,
                "cached_tokens": max(p.lookup.reused, p.lookup.gpu_hit_tokens),
                "first_byte_ns": first, "first_token_ns": first if p.gen.total else None, "last_token_ns": end,
                "end_ns": end,
                # the model holds no answers' text: a sound build's stand-in, one per body, so that a
                # consistency phase is forecast as it runs on a sound host (consistent)
                "output_sha256": hashlib.sha256(body).hexdigest()}

    async def complete(self, body: bytes, what: str) -> dict:
        p = await self.generate(body, what, routed=False)
        return {"finish_reason": p.gen.finish_reason, "request_id": None}

    async def generate(self, raw: bytes, what: str, routed: bool) -> Any:
        """One generation through the host model, in virtual time: its plan once it has finished."""
        h = self.sim
        h.requests_seen += 1
        if routed and not h.backend["admitted"]:
            raise _http(503, "unavailable", "no admitted backend", what)
        e = h.engine
        if e is None or h.crashed:
            raise _http(503, "unavailable", "no incarnation loaded", what)
        p = e.plan(raw, _parsed(raw))
        k = h.request_noise(e, p.seed)
        p.restore_s, p.prefill_s, p.decode_s = p.restore_s * k, p.prefill_s * k, p.decode_s * k
        e.active += 1
        if p.restore_s:
            e.transfers_inflight += 1
        restored_at = self.now() + int(p.restore_s * S)
        prefilled_at = restored_at + int(p.prefill_s * S)
        await At(restored_at)
        if p.restore_s:
            e.transfers_inflight -= 1
        await At(prefilled_at)
        pinned = e.after_prefill(p)
        await At(prefilled_at + _ns_sum(p.decode_s, p.gen.total, self.chunk))
        if e is h.engine:
            e.finish(p, pinned)
            e.resident_bytes += h.creep_bytes
        e.active -= 1
        h.requests_done += 1
        return p


class ModelRouter:
    present = True

    def __init__(self, sim: Any, serving: ModelServing) -> None:
        self.sim, self.serving = sim, serving

    async def snapshot(self) -> dict[str, Any]:
        return {"config_sha256": self.sim.router_config_sha, "backend": self.sim.backend}

    async def _backend(self, admitted: bool) -> dict[str, Any]:
        self.sim.backend = {**self.sim.backend, "admitted": admitted, "inflight": 0}
        return dict(self.sim.backend)

    async def quiesce(self) -> dict[str, Any]:
        return await self._backend(False)

    async def readmit(self) -> dict[str, Any]:
        return await self._backend(True)

    async def complete(self, body: bytes, what: str) -> dict[str, Any]:
        p = await self.serving.generate(body, what, routed=True)
        return {"finish_reason": p.gen.finish_reason, "request_id": None}


class ModelMonitoring:
    present = True

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.target = str(sim.monitoring.get("id", ""))

    async def snapshot(self) -> dict[str, Any]:
        return {"target": {**self.sim.monitoring, "healthy": bool(self.sim.engine)}}


class ModelGpu:
    present = True
    source = "sim"

    def __init__(self, sim: Any) -> None:
        self.sim = sim

    async def view(self) -> dict[str, Any]:
        return {"gpus": self.sim.gpu_list(), "xid_events": self.sim.xid_events}

    async def close(self) -> None:
        return None


def model_host(sim: Any, now: Callable[[], int], chunk: int) -> Host:
    """flaresim's host `sim` behind the five ports, on the window clock `now` (ns)."""
    serving = ModelServing(sim, now, chunk)
    return Host(ModelManager(sim, now), serving, ModelRouter(sim, serving), ModelMonitoring(sim), ModelGpu(sim))


def scraped(sim: Any) -> dict:
    """What `/metrics` reads as from flaresim's exposition, taken from the families the exposition is
    written from (daemon.hosts.metrics.shape on both paths; only the text is skipped)."""
    from flare_diag.daemon.simulator import families
    parsed: dict[str, list] = {}
    for name, kind, _help, samples in families(sim) or ():  # a host with nothing loaded exposes no family
        if kind == "histogram":  # (sum, count), as the exposition writes them
            parsed[name] = [Sample(f"{name}_{part}", {}, float(v)) for part, (_l, v) in zip(("sum", "count"), samples)]
            continue
        sample = f"{name}_total" if kind == "counter" else name
        parsed[name] = [Sample(sample, {k: str(v) for k, v in labels.items()}, float(v)) for labels, v in samples]
    return metrics.shape(parsed)


def _parsed(raw: bytes) -> dict:
    parsed = _PARSED.get(raw)
    if parsed is None:
        if len(_PARSED) > 4096:
            _PARSED.clear()
        parsed = _PARSED[raw] = json.loads(raw)  # the same bodies, run after run
    return parsed


def _ns_sum(decode_s: float, tokens: int, chunk: int) -> int:
    """A streamed answer's decode time as flaresim sleeps it: chunk by chunk, each rounded as a sleep is."""
    if tokens <= 0:
        return 0
    per_tok = decode_s / tokens
    return sum(int(per_tok * min(chunk, tokens - i) * S) for i in range(0, tokens, chunk))
