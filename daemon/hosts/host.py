"""The host a window acts on, as ports: `build_host(site)` picks an adapter for each of the five roles
(recipe manager, serving engine, router, monitoring, GPUs) from the site profile. Nothing outside
daemon/hosts/ asks which kind of site it has; it asks a port (`present`, its calls)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from flare_diag.daemon.hosts.errors import ActionFailed
from flare_diag.daemon.hosts.ports import HttpManager, HttpServing, JsonCalls, LocalServing, Manager, Serving, complete_at
from flare_diag.daemon.hosts.site import Engine, Site

if TYPE_CHECKING:  # imported where first used: the local engine and NVML only on the sites that have them
    from flare_diag.daemon.hosts.localengine import LocalEngine
    from flare_diag.daemon.hosts.nvml import XidWatcher


class Router(Protocol):
    """The pool's router (contract section 1): the primary's backend, its quiesce and readmission, and
    where routed generations go."""

    present: bool

    async def snapshot(self) -> dict[str, Any]: ...
    async def quiesce(self) -> dict[str, Any]: ...
    async def readmit(self) -> dict[str, Any]: ...
    async def complete(self, body: bytes, what: str) -> dict[str, Any]: ...  # one generation on the routed path


class Monitoring(Protocol):
    """The site's monitoring: the primary's target (registered, healthy)."""

    present: bool
    target: str  # the primary's target id ("" without monitoring)

    async def snapshot(self) -> dict[str, Any]: ...


class Gpu(Protocol):
    """The GPUs' view (memory, power limits, Xid events): NVML on the host, a simulator's, or none."""

    present: bool  # False: a CPU engine; its view is empty and its rules are not enforced
    source: str  # how the view is read, as the profile names it: "nvml", "sim" or "none"

    async def view(self) -> dict[str, Any]: ...
    async def close(self) -> None: ...


class HttpRouter:
    present = True

    def __init__(self, calls: JsonCalls, url: str, backend: str) -> None:
        self.t, self.url, self.backend = calls, url, backend

    async def snapshot(self) -> dict[str, Any]:
        d = await self.t.get_json("router", f"{self.url}/router/v1/backends", "router backends")
        backends = d.get("backends")
        if not isinstance(backends, list):
            raise ActionFailed("malformed_transport", 'router backends: expected {"backends": [...]}')
        b = _the_one("router backends", backends, self.backend)
        if b is None:
            raise ActionFailed("containment", f"router has no backend {self.backend!r}")
        return {"config_sha256": d.get("config_sha256"), "backend": b}

    async def quiesce(self) -> dict[str, Any]:
        return await self.t.post_json("router", f"{self.url}/router/v1/backends/{self.backend}/quiesce", "quiesce")

    async def readmit(self) -> dict[str, Any]:
        return await self.t.post_json("router", f"{self.url}/router/v1/backends/{self.backend}/readmit", "readmit")

    async def complete(self, body: bytes, what: str) -> dict[str, Any]:
        return await complete_at(self.t, "router", f"{self.url}/v1/chat/completions", body, what)


class NoRouter:
    present = False

    async def snapshot(self) -> dict[str, Any]:
        raise ActionFailed("not_applicable", "the site has no router")

    async def quiesce(self) -> dict[str, Any]:
        raise ActionFailed("not_applicable", "the site has no router")

    async def readmit(self) -> dict[str, Any]:
        raise ActionFailed("not_applicable", "the site has no router")

    async def complete(self, body: bytes, what: str) -> dict[str, Any]:
        raise ActionFailed("not_applicable", "the site has no router")


def _the_one(what: str, entries: list[Any], id_: str) -> dict[str, Any] | None:
    """The entry with this id, or None; listed more than once, the host's answer says two things about
    one backend (a stale entry beside the live one), so neither is taken for it."""
    found = [x for x in entries if isinstance(x, dict) and x.get("id") == id_]
    if len(found) > 1:
        raise ActionFailed("malformed_transport", f"{what}: {id_!r} is listed {len(found)} times")
    return found[0] if found else None


class HttpMonitoring:
    present = True

    def __init__(self, calls: JsonCalls, url: str, target: str) -> None:
        self.t, self.url, self.target = calls, url, target

    async def snapshot(self) -> dict[str, Any]:
        d = await self.t.get_json("monitoring", f"{self.url}/monitoring/v1/targets", "monitoring targets")
        targets = d.get("targets")
        if not isinstance(targets, list):
            raise ActionFailed("malformed_transport", 'monitoring targets: expected {"targets": [...]}')
        return {"target": _the_one("monitoring targets", targets, self.target)}


class NoMonitoring:
    present = False
    target = ""

    async def snapshot(self) -> dict[str, Any]:
        raise ActionFailed("not_applicable", "the site has no monitoring")


class NoGpu:
    present = False
    source = "none"

    async def view(self) -> dict[str, Any]:
        return {"gpus": [], "xid_events": []}

    async def close(self) -> None:
        return None


class SimGpu:
    """A simulator's GPU view (`/sim/v1/gpu`)."""

    present = True
    source = "sim"

    def __init__(self, calls: JsonCalls, url: str) -> None:
        self.t, self.url = calls, url

    async def view(self) -> dict[str, Any]:
        return await self.t.get_json("gpu", f"{self.url}/sim/v1/gpu", "GPU view")

    async def close(self) -> None:
        return None


class NvmlGpu:
    """The host's GPUs through NVML. NVML blocks: the reads and the Xid event wait stay off the event
    loop, the watcher on a thread of its own, started at the first read. One read at a time: a caller waits for
    the read in flight to return before its own starts, so a read NVML never returns (a driver that stopped
    answering) is not joined by another each second, each holding one of the worker threads the daemon's
    other blocking calls share, until none is left."""

    present = True
    source = "nvml"

    def __init__(self, nv: ModuleType | None = None) -> None:
        self._nv = nv  # NVML's module; None: nvidia-ml-py's, imported at the first read
        self._xids: XidWatcher | None = None
        self._reading: asyncio.Future[dict[str, Any]] | None = None

    async def view(self) -> dict[str, Any]:
        view = await self._read()
        xids = self._xids
        assert xids is not None  # the read started it first
        view["xid_events"] = xids.events()
        if xids.error:
            view["xid_watch_error"] = xids.error
        if xids.unsupported:
            view["unsupported"] = list(xids.unsupported)
        return view

    async def _read(self) -> dict[str, Any]:
        """A read of this caller's own, started once the read in flight (anyone's) has returned."""
        while self._reading is not None and not self._reading.done():
            await asyncio.wait([self._reading])  # a caller's deadline ends this wait, never the read
        self._reading = asyncio.get_running_loop().run_in_executor(None, self._read_blocking)
        return await asyncio.shield(self._reading)  # a caller's deadline leaves the read to finish alone

    def _read_blocking(self) -> dict[str, Any]:
        """The Xid watcher started (once; NvmlUnavailable on a machine without the driver), then the GPUs read."""
        from flare_diag.daemon.hosts.nvml import XidWatcher, read_gpus
        if self._xids is None:  # reads run one at a time: no second watcher
            xids = XidWatcher(self._nv)
            xids.start()
            self._xids = xids
        return read_gpus(self._nv)

    async def close(self) -> None:
        if self._xids is not None:
            await asyncio.to_thread(self._xids.stop)  # joins the NVML event thread: not on the loop


@dataclass
class Host:
    """A site's five roles, each behind its port (HTTP, a local engine, or the host model's)."""

    manager: Manager
    serving: Serving
    router: Router
    monitoring: Monitoring
    gpu: Gpu
    engine: LocalEngine | None = None  # the engine the daemon runs itself, where the site has one


def build_host(site: Site, calls: JsonCalls, serving_headers: dict[str, str]) -> Host:
    """The adapters the site profile names: a manager service or a local engine, a router, monitoring
    and GPUs where it has them."""
    from flare_diag.daemon.hosts.engine_profiles import metric_names
    p = site.profile
    engine: LocalEngine | None = None
    manager: Manager
    serving: Serving
    names = metric_names(p.metrics_profile, p.metrics)
    if p.engine is not None:
        engine = local_engine(site, p.engine)
        if not engine.host_tier():  # no host tier: its reuse is not applicable, never 0
            names = {k: v for k, v in names.items() if not k.startswith("flare_host_cache_")}
        manager, serving = engine, LocalServing(engine, serving_headers, HttpServing(calls, p.serving.url, names))
    else:
        assert p.manager is not None  # a profile has exactly one of [engine] and [manager] (site.py)
        manager, serving = HttpManager(calls, p.manager.url), HttpServing(calls, p.serving.url, names)
    router: Router = HttpRouter(calls, p.router.url, p.router.backend or "") if p.router is not None else NoRouter()
    monitoring: Monitoring = (HttpMonitoring(calls, p.monitoring.url, p.monitoring.target or "")
                              if p.monitoring is not None else NoMonitoring())
    gpu: Gpu = NoGpu() if not site.gpus_watched else SimGpu(calls, p.gpu.url or "") if site.simulated else NvmlGpu()
    return Host(manager, serving, router, monitoring, gpu, engine)


def local_engine(site: Site, e: Engine) -> LocalEngine:
    """The engine a site's [engine] section describes, which the daemon runs itself."""
    from flare_diag.daemon.hosts.localengine import LocalEngine, LocalRecipe
    base = site.base_dir
    binary = Path(os.path.expandvars(e.binary))
    binary = binary if binary.is_absolute() else base / binary
    recipes = {n: LocalRecipe(n, r.args, base / r.model, r.env, e.kind) for n, r in e.recipes.items()}
    key_file = site.token_path("serving") if site.profile.serving.token_file else None
    return LocalEngine(binary, recipes, e.incumbent, site.profile.serving.url, key_file, base / e.log_dir,
                       e.load_timeout_s)
