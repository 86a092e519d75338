"""The host's services as ports: what a window asks of a recipe manager and of the serving engine's
control endpoints, each with an HTTP implementation (contract section 1); a local engine the daemon
runs itself (daemon/hosts/localengine.py) implements both. `Target` composes them; nothing else branches
on which kind of host it talks to."""

from __future__ import annotations

from typing import Protocol

from flare_diag.daemon.hosts.errors import ActionFailed


class JsonCalls(Protocol):
    """The target's HTTP calls (its clients, the site's tokens, its retries and timeouts per service)."""

    async def get_json(self, svc: str, url: str, what: str) -> dict: ...
    async def post_json(self, svc: str, url: str, what: str, body: dict | None = None, once: bool = False) -> dict: ...


class Manager(Protocol):
    """The managed recipe lifecycle: recipes are immutable bytes named by their sha256."""

    async def prepare(self) -> None: ...
    async def state(self) -> dict: ...
    async def recipe(self, name: str) -> dict: ...
    async def preview(self, op: str, name: str, sha256: str | None) -> dict: ...
    async def load(self, name: str, sha256: str) -> dict: ...
    async def unload(self, name: str, sha256: str) -> dict: ...
    async def close(self) -> None: ...


class Serving(Protocol):
    """The engine's own control endpoints besides generation and /metrics: its identity and trace switch."""

    trace_switch: bool

    async def identity(self) -> dict: ...
    async def trace(self, enabled: bool) -> dict: ...


class HttpManager:
    """contract section 1, Recipe manager: `/manager/v1/...` on the site's manager URL. Loads and
    unloads go out once, each on a connection of its own (they change the host)."""

    def __init__(self, calls: JsonCalls, url: str) -> None:
        self.t = calls
        self.url = url

    async def prepare(self) -> None:
        return None  # a manager service is already running

    async def close(self) -> None:
        return None  # its connections are the target's

    async def state(self) -> dict:
        return await self.t.get_json("manager", f"{self.url}/manager/v1/state", "manager state")

    async def recipe(self, name: str) -> dict:
        return await self.t.get_json("manager", f"{self.url}/manager/v1/recipes/{name}", f"recipe {name}")

    async def preview(self, op: str, name: str, sha256: str | None) -> dict:
        return await self.t.post_json("manager", f"{self.url}/manager/v1/preview", "preview",
                                  {"op": op, "recipe": name, "sha256": sha256})

    async def load(self, name: str, sha256: str) -> dict:
        return await self.t.post_json("manager", f"{self.url}/manager/v1/load", "load", {"recipe": name, "sha256": sha256},
                                  once=True)

    async def unload(self, name: str, sha256: str) -> dict:
        return await self.t.post_json("manager", f"{self.url}/manager/v1/unload", "unload",
                                  {"recipe": name, "sha256": sha256}, once=True)


class HttpServing:
    """contract section 1, Serving: `GET /flare/v1/identity`, `POST /flare/v1/trace`."""

    trace_switch = True

    def __init__(self, calls: JsonCalls, url: str) -> None:
        self.t = calls
        self.url = url

    async def identity(self) -> dict:
        return await self.t.get_json("serving", f"{self.url}/flare/v1/identity", "identity")

    async def trace(self, enabled: bool) -> dict:
        return await self.t.post_json("serving", f"{self.url}/flare/v1/trace", "trace", {"enabled": enabled})


class LocalServing:
    """A local engine's identity (read from the process it started and its /props); no trace switch."""

    trace_switch = False

    def __init__(self, engine, headers: dict) -> None:
        self.engine = engine
        self.headers = headers

    async def identity(self) -> dict:
        return await self.engine.identity(self.headers)

    async def trace(self, enabled: bool) -> dict:
        raise ActionFailed("not_applicable", "this engine has no request-trace switch")
