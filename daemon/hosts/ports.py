"""The host's services as ports: what a window asks of a recipe manager and of the serving engine (contract
section 1), each with an HTTP implementation; a local engine the daemon runs itself
(daemon/hosts/localengine.py) implements the manager and answers for its own identity, and a host model
(daemon/hosts/model.py) implements every port in virtual time. `Actions` (daemon/hosts/actions.py)
composes them; nothing else branches on which kind of host it talks to."""

from __future__ import annotations

import json
from typing import Any, Protocol

import httpx

from flare_diag.daemon.hosts import metrics
from flare_diag.daemon.hosts.engine_profiles import ANSWER_NAMES_SERVED_MODEL
from flare_diag.daemon.hosts.errors import ActionFailed, answer_json, classify_response, json_object


class JsonCalls(Protocol):
    """The HTTP calls the adapters make (the target's clients, the site's tokens, its retries and
    timeouts per service)."""

    async def get_json(self, svc: str, url: str, what: str) -> dict: ...
    async def post_json(self, svc: str, url: str, what: str, body: dict | None = None, once: bool = False) -> dict: ...
    async def get(self, svc: str, url: str) -> httpx.Response: ...
    async def stream_short(self, svc: str, url: str, body: bytes, what: str) -> dict: ...
    async def stream_chat(self, svc: str, url: str, body: bytes) -> dict: ...


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
    """The serving engine: its identity and trace switch, its health and metrics, and generation (a
    streamed chat completion of exact body bytes, and one short completion: the preflight)."""

    trace_switch: bool

    async def identity(self) -> dict: ...
    async def trace(self, enabled: bool) -> dict: ...
    async def health(self) -> dict: ...  # {"status": the HTTP status of /health}
    async def metrics(self) -> dict: ...  # /metrics in contract names: {counters, gauges, labels}
    async def chat(self, body: bytes) -> dict: ...  # a request_done's fields (outcome, timings, usage, digests)
    async def complete(self, body: bytes, what: str) -> dict: ...  # {"finish_reason", "request_id"}
    async def models(self) -> list[str] | None: ...  # `GET /v1/models`' ids; None where it serves no such list
    async def openapi(self) -> dict | None: ...  # its published request schema, where it publishes one


def model_ids(answer: object) -> list[str]:
    """`GET /v1/models`' ids (entries without a string id are left out); any other shape is malformed."""
    data = json_object(answer, "models").get("data")
    if not isinstance(data, list):
        raise ActionFailed("malformed_transport", 'models: expected {"data": [{"id": ...}]}')
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


async def complete_at(calls: JsonCalls, svc: str, url: str, body: bytes, what: str) -> dict:
    """One short generation at `url`, streamed once on a connection of its own: its finish reason and id."""
    return await calls.stream_short(svc, url, body, what)


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
    """contract section 1, Serving: `GET /flare/v1/identity`, `POST /flare/v1/trace`, `GET /health`,
    `GET /metrics` (read through the site's metrics profile), `POST /v1/chat/completions`."""

    trace_switch = True

    def __init__(self, calls: JsonCalls, url: str, metric_names: dict[str, str]) -> None:
        self.t = calls
        self.url = url
        self.metric_names = metric_names

    async def identity(self) -> dict:
        return await self.t.get_json("serving", f"{self.url}/flare/v1/identity", "identity")

    async def trace(self, enabled: bool) -> dict:
        return await self.t.post_json("serving", f"{self.url}/flare/v1/trace", "trace", {"enabled": enabled})

    async def health(self) -> dict:
        """200 when an incarnation is loaded and ready, 503 otherwise (a refused token raises)."""
        r = await self.t.get("serving", f"{self.url}/health")
        if r.status_code == 401:
            raise classify_response(r, "health")
        return {"status": r.status_code}

    async def metrics(self) -> dict:
        r = await self.t.get("serving", f"{self.url}/metrics")
        if r.status_code != 200:
            raise classify_response(r, "metrics")
        try:
            return metrics.parse(r.text, self.metric_names)
        except metrics.MetricsError as exc:
            raise ActionFailed("malformed_transport", str(exc)) from None

    async def answer(self, body: bytes) -> dict:
        """The stream's RequestDone fields as the engine gave them, the model its answer named included."""
        return await self.t.stream_chat("serving", f"{self.url}/v1/chat/completions", body)

    async def chat(self, body: bytes) -> dict:
        done = await self.answer(body)
        done.pop("model_answered", None)  # Flare's contract says nothing of what an answer's `model` names
        return done

    async def complete(self, body: bytes, what: str) -> dict:
        return await complete_at(self.t, "serving", f"{self.url}/v1/chat/completions", body, what)

    async def models(self) -> list[str] | None:
        """None when the engine does not answer `/v1/models` (not an error: a Flare host need not serve it)."""
        r = await self.t.get("serving", f"{self.url}/v1/models")
        if r.status_code in (404, 405):
            return None
        if r.status_code != 200:
            raise classify_response(r, "models")
        return model_ids(answer_json(r, "models"))

    async def openapi(self) -> dict | None:
        """vLLM's and SGLang's servers publish theirs; None when the engine does not (a Flare host need not)."""
        r = await self.t.get("serving", f"{self.url}/openapi.json")
        if r.status_code in (404, 405):
            return None
        if r.status_code != 200:
            raise classify_response(r, "openapi")
        doc = answer_json(r, "openapi")
        return doc if isinstance(doc, dict) else None


class LocalServing:
    """A local engine's serving: its identity read from the process it started and its /props, no trace
    switch, and its own process group's resident memory where its /metrics gives none; the rest over
    HTTP as any engine's."""

    trace_switch = False

    def __init__(self, engine: Any, headers: dict, http: HttpServing) -> None:
        self.engine = engine
        self.headers = headers
        self.http = http

    async def identity(self) -> dict:
        return await self.engine.identity(self.headers)

    async def trace(self, enabled: bool) -> dict:
        raise ActionFailed("not_applicable", "this engine has no request-trace switch")

    async def health(self) -> dict:
        return await self.http.health()

    async def metrics(self) -> dict:
        m = await self.http.metrics()
        if m["gauges"].get("resident_bytes") is None:
            m["gauges"]["resident_bytes"] = self.engine.resident_bytes()  # the engine's whole process group
        return m

    async def chat(self, body: bytes) -> dict:
        done = await self.http.answer(body)
        loaded = self.engine.loaded
        if loaded is None or loaded.kind not in ANSWER_NAMES_SERVED_MODEL:
            done.pop("model_answered", None)  # its answers echo the body (engine_profiles.py): no witness
        else:
            done["model_asked"] = _asked_model(body)
        return done

    async def complete(self, body: bytes, what: str) -> dict:
        return await self.http.complete(body, what)

    async def models(self) -> list[str] | None:
        return await self.http.models()

    async def openapi(self) -> dict | None:
        return await self.http.openapi()


def _asked_model(body: bytes) -> str:
    """The `model` a request body names ("" where it names none)."""
    try:
        asked = json.loads(body).get("model")
    except (ValueError, AttributeError, RecursionError):
        return ""
    return asked if isinstance(asked, str) else ""
