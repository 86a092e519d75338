"""Carries out the policy's actions against a site's services over HTTP (httpx, httpx-sse)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx
from httpx_sse import aconnect_sse

from flare_diag.daemon.hosts import metrics
from flare_diag.events import actions as act
from flare_diag.daemon.hosts.prometheus import Prometheus
from flare_diag.daemon.hosts.errors import ActionFailed, answer_json, answer_object, classify_response, json_object
from flare_diag.daemon.hosts.stream_errors import stream_error
from flare_diag.daemon.hosts.fixture import Fixture
from flare_diag.daemon.hosts.host import build_host
from flare_diag.daemon.hosts.site import Site, SiteProfile
from flare_diag.daemon.hosts.httpclient import STALE_CONNECTION, host_client
from flare_diag.daemon.hosts.stamping import SendClock, StampingTransport, read_ns, stamped_transport

RESPONSE_CAP = 4096


def preflight_body(model: str | None) -> bytes:
    """The restore's preflight generation, naming the model the window's own bodies name (an engine
    refuses a model it does not serve: vLLM answers 404 for any other name); None: no model field."""
    body: dict = {"messages": [{"role": "user", "content": "preflight"}], "max_tokens": 8, "stream": False}
    return json.dumps({"model": model, **body} if model is not None else body).encode()


def finish_reason(answer: object, what: str) -> str | None:
    """A chat completion's first choice's finish_reason; its absence or any other shape is malformed."""
    choices = json_object(answer, what).get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(first, dict):
        raise ActionFailed("malformed_transport", f"{what}: the answer has no choices")
    reason = first.get("finish_reason")
    return reason if isinstance(reason, str) else None


def model_ids(answer: object) -> list[str]:
    """`GET /v1/models`' ids (entries without a string id are left out); any other shape is malformed."""
    data = json_object(answer, "models").get("data")
    if not isinstance(data, list):
        raise ActionFailed("malformed_transport", 'models: expected {"data": [{"id": ...}]}')
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def fixture_model(fixtures: dict[str, Fixture]) -> str | None:
    """The model the fixtures' bodies name (the first body that names one), or None."""
    for name in sorted(fixtures):
        for m in fixtures[name].models():
            return m
    return None


class Target:
    def __init__(self, site: Site, fixtures: dict[str, Fixture], plan_sha256: str,
                 recipe_dir: Path | None = None) -> None:
        self.site = site
        self.p = site.profile
        self.fixtures = fixtures
        self.plan_sha256 = plan_sha256
        self.recipe_dir = recipe_dir  # retained recipe bytes, content-addressed, beside the log
        timeout = httpx.Timeout(600.0, connect=10.0)
        # reads and state-setting calls share a pool (they may be retried once on a fresh connection)
        self.client = host_client(timeout=timeout, transport=site.transport)
        # generations, loads and unloads each get a connection of their own: one the host may have
        # closed while idle can never be picked for them, and they are never sent twice
        # (their answers' chunks stamped as they are read off the transport, before any parsing)
        inner = site.transport or stamped_transport(_service_urls(site.profile))
        self.fresh = host_client(timeout=timeout, transport=StampingTransport(inner, _now_ns))
        # the site's Prometheus, which the plan's steady-state guards query (never through the
        # site's transport: a rehearsal's in-process simulator is not where Prometheus lives)
        self.prometheus = Prometheus(site) if site.profile.steady_state is not None else None
        # the host's five roles behind their ports, chosen from the profile (daemon/hosts/host.py)
        self.host = build_host(site, self, self._h("serving"))
        self.manager, self.serving, self.engine = self.host.manager, self.host.serving, self.host.engine
        from flare_diag.daemon.hosts.engine_profiles import metric_names
        self._metric_names = metric_names(site.profile.metrics_profile, site.profile.metrics)
        if self.engine is not None and not self.engine.host_tier():  # no host tier: its reuse is not applicable, never 0
            self._metric_names = {k: v for k, v in self._metric_names.items() if not k.startswith("flare_host_cache_")}
        self._preflight_model: tuple[str | None] | None = None  # found once: (model,)

    def handlers(self) -> dict[type[act.Action], Callable[[dict], Awaitable[dict]]]:
        """Each action type (events/actions.py) to the method that carries it out."""
        return {act.ValidateFixtures: self.validate_fixtures, act.Snapshot: self.snapshot,
                act.RetainRecipe: self.retain_recipe, act.Preview: self.preview, act.Quiesce: self.quiesce,
                act.Readmit: self.readmit, act.Unload: self.unload, act.Load: self.load,
                act.ReadIdentity: self.read_identity, act.ScrapeMetrics: self.scrape_metrics,
                act.SetTrace: self.set_trace, act.ManagerState: self.manager_state, act.Health: self.health,
                act.SteadyState: self.steady_state,
                act.Preflight: self.preflight, act.SendRequest: self.send_request}

    async def close(self) -> None:
        await self.client.aclose()
        await self.fresh.aclose()
        if self.prometheus is not None:
            await self.prometheus.close()
        await self.manager.close()
        await self.host.gpu.close()

    def _h(self, svc: str) -> dict:
        tok = self.site.tokens.get(svc)
        return {"Authorization": f"Bearer {tok}"} if tok else {}

    async def _retrying(self, method: str, url: str, **kw) -> httpx.Response:
        """An idempotent call: once more on a new connection if the pooled one was stale."""
        try:
            return await self.client.request(method, url, **kw)
        except STALE_CONNECTION:
            return await self.fresh.request(method, url, **kw)

    async def get_json(self, svc: str, url: str, what: str) -> dict:
        r = await self._retrying("GET", url, headers=self._h(svc))
        if r.status_code != 200:
            raise classify_response(r, what)
        return answer_object(r, what)

    async def post_json(self, svc: str, url: str, what: str, body: dict | None = None, once: bool = False) -> dict:
        """POST; `once`: it may change the host (load, unload), so it goes out once on its own connection."""
        if once:
            r = await self.fresh.post(url, headers=self._h(svc), json=body or {})
        else:
            r = await self._retrying("POST", url, headers=self._h(svc), json=body or {})
        if r.status_code != 200:
            raise classify_response(r, what)
        return answer_object(r, what)

    # --- actions: each returns the outcome's data or raises ActionFailed
    async def validate_fixtures(self, args: dict) -> dict:
        return {"fixtures": {n: f.work() for n, f in self.fixtures.items() if n in args.get("fixtures", [])}}

    async def snapshot(self, args: dict) -> dict:
        what = args["what"]
        if what == "incumbent":
            st = await self.manager_state({})
            loaded = st.get("loaded")
            if not loaded:
                raise ActionFailed("no_incumbent", "the manager reports no recipe loaded")
            ident = await self.read_identity({})
            return {**loaded, "identity": ident}
        if what == "router":
            return await self.host.router.snapshot()
        if what == "monitoring":
            return await self.host.monitoring.snapshot()
        if what == "gpu":
            if not self.host.gpu.present:
                raise ActionFailed("not_applicable", "the site has no GPU (gpu.source = \"none\")")
            return await self.host.gpu.view()
        if what == "configuration":
            return {"site": self.site.name, "site_sha256": self.site.sha256, "plan_sha256": self.plan_sha256}
        raise ActionFailed("internal", f"unknown snapshot {what!r}")

    async def retain_recipe(self, args: dict) -> dict:
        """Fetches a recipe's exact bytes, checks them against their sha256, and keeps them.

        The bytes are written once under `recipe_dir/<sha256>` (content-addressed, so the same
        recipe retained by two windows is one file); every later load, unload and the restore name
        this hash. `expect_sha256`, when given, is what the manager says is loaded."""
        name = args["recipe"]
        rec = await self.manager.recipe(name)
        try:
            content = base64.b64decode(rec["content_b64"], validate=True)
            claimed = rec["sha256"]
        except (KeyError, TypeError, ValueError):
            raise ActionFailed("malformed_transport", f"recipe {name}: expected name, sha256 and base64 content_b64") from None
        sha = hashlib.sha256(content).hexdigest()
        if sha != claimed:
            raise ActionFailed("identity_drift", f"recipe {name}: its bytes hash to {sha[:12]}, the manager says {str(claimed)[:12]}")
        expect = args.get("expect_sha256")
        if expect is not None and sha != expect:
            raise ActionFailed("identity_drift", f"recipe {name}: its bytes hash to {sha[:12]}, the loaded recipe is {str(expect)[:12]}")
        out = {"recipe": name, "sha256": sha, "bytes": len(content)}
        if self.recipe_dir is not None and args.get("keep", True):  # a site check reads, never writes
            out["path"] = str(await asyncio.to_thread(_keep, self.recipe_dir, sha, content))
        return out

    async def steady_state(self, args: dict) -> dict:
        """Every guard's query once: {"when", "guards": {name: {"values", "series"} | {"error"}}}; a
        guard whose query failed says why, the others still answer."""
        if self.prometheus is None:
            raise ActionFailed("not_applicable", "the site has no [steady_state] prometheus_url")
        out: dict = {}
        for name, query in args["queries"].items():
            try:
                out[name] = await self.prometheus.query(query)
            except ActionFailed as exc:
                out[name] = {"error": exc.detail}
        return {"when": args["when"], "guards": out}

    async def gpu_view(self) -> dict:
        return await self.host.gpu.view()

    async def health(self, args: dict) -> dict:
        """`GET /health`: 200 when an incarnation is loaded and ready, 503 otherwise (a refused token raises)."""
        r = await self._retrying("GET", f"{self.p.serving.url}/health", headers=self._h("serving"))
        if r.status_code == 401:
            raise classify_response(r, "health")
        return {"status": r.status_code}

    async def preview(self, args: dict) -> dict:
        return await self.manager.preview(args["op"], args["recipe"], args.get("sha256"))

    async def quiesce(self, args: dict) -> dict:
        return await self.host.router.quiesce()

    async def readmit(self, args: dict) -> dict:
        return await self.host.router.readmit()

    async def scrape_metrics(self, args: dict) -> dict:
        r = await self._retrying("GET", f"{self.p.serving.url}/metrics", headers=self._h("serving"))
        if r.status_code != 200:
            raise classify_response(r, "metrics")
        try:
            m = metrics.parse(r.text, self._metric_names)
        except metrics.MetricsError as exc:
            raise ActionFailed("malformed_transport", str(exc)) from None
        if self.engine is not None and m["gauges"].get("resident_bytes") is None:
            m["gauges"]["resident_bytes"] = self.engine.resident_bytes()  # the engine's whole process group
        return m

    def host_tier(self) -> bool | None:
        """Whether the host has a tier behind the engine's own cache: known for an engine the daemon
        runs itself (its recipes' configuration), None (unknown) otherwise."""
        return None if self.engine is None else self.engine.host_tier()

    async def unload(self, args: dict) -> dict:
        return await self.manager.unload(args["recipe"], args["sha256"])

    async def load(self, args: dict) -> dict:
        return await self.manager.load(args["recipe"], args["sha256"])

    async def read_identity(self, args: dict) -> dict:
        return await self.serving.identity()

    async def set_trace(self, args: dict) -> dict:
        return await self.serving.trace(args["enabled"])

    async def manager_state(self, args: dict) -> dict:
        return await self.manager.state()

    async def preflight(self, args: dict) -> dict:
        if args["path"] == "routed":
            routed = self.host.router.generation_url
            if routed is None:
                raise ActionFailed("not_applicable", "the site has no router")
            url, svc = routed, "router"
        else:
            url, svc = f"{self.p.serving.url}/v1/chat/completions", "serving"
        body = preflight_body(await self.preflight_model())
        r = await self.fresh.post(url, content=body, headers={**self._h(svc), "content-type": "application/json"})
        if r.status_code != 200:
            raise classify_response(r, f"{args['path']} preflight")
        what = f"{args['path']} preflight"
        return {"finish_reason": finish_reason(answer_json(r, what), what), "request_id": r.headers.get("x-request-id")}

    async def served_models(self) -> list[str] | None:
        """The engine's `GET /v1/models` ids; None when it does not answer that (not an error: a Flare
        host need not serve it)."""
        r = await self._retrying("GET", f"{self.p.serving.url}/v1/models", headers=self._h("serving"))
        if r.status_code in (404, 405):
            return None
        if r.status_code != 200:
            raise classify_response(r, "models")
        return model_ids(answer_json(r, "models"))

    async def openapi(self) -> dict | None:
        """The engine's `GET /openapi.json` (vLLM's and SGLang's servers publish theirs); None when it
        does not answer that (a Flare host need not)."""
        r = await self._retrying("GET", f"{self.p.serving.url}/openapi.json", headers=self._h("serving"))
        if r.status_code in (404, 405):
            return None
        if r.status_code != 200:
            raise classify_response(r, "openapi")
        doc = answer_json(r, "openapi")
        return doc if isinstance(doc, dict) else None

    async def preflight_model(self) -> str | None:
        """The model the preflight names: the fixtures', else the first the engine lists, else none."""
        if self._preflight_model is None:
            model = fixture_model(self.fixtures)
            if model is None:
                served = await self.served_models()
                model = served[0] if served else None
            self._preflight_model = (model,)
        return self._preflight_model[0]

    async def send_request(self, args: dict) -> dict:
        """Sends the exact body bytes and returns the RequestDone fields (raises on abort-class errors)."""
        fx = self.fixtures[args["fixture"]]
        body = fx.bodies[args["body_index"]]
        clock = SendClock(_now_ns)
        out: dict = {"outcome": "ok"}
        first_byte = first_token = last_token = None
        visible = reasoning = False
        usage = None
        finish = None
        digest = hashlib.sha256()
        # the answer itself, its reasoning and its content, without the stream's ids, framing or
        # chunking: what an output-consistency phase compares between a cold answer and a reused one
        said_r, said_c = hashlib.sha256(), hashlib.sha256()
        head = bytearray()
        total = 0
        done = False
        headers = {**self._h("serving"), "content-type": "application/json"}
        async with aconnect_sse(self.fresh, "POST", f"{self.p.serving.url}/v1/chat/completions",
                                content=body, headers=headers, extensions=clock.extensions()) as es:
            t0 = clock.t0  # its headers went out on an open connection: the connect is not in its times
            resp = es.response
            if resp.status_code != 200:
                await resp.aread()
                raise classify_response(resp, "chat completion")
            out["request_id"] = resp.headers.get("x-request-id")
            out["status_code"] = resp.status_code
            async for sse in es.aiter_sse():
                now = read_ns(resp, _now_ns) - t0  # when its bytes were read, not when they were parsed
                first_byte = first_byte if first_byte is not None else now
                data = sse.data.encode()
                digest.update(data + b"\n")
                total += len(data) + 1
                if len(head) < RESPONSE_CAP:
                    head.extend(data[: RESPONSE_CAP - len(head)])
                if sse.data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(sse.data)
                except (ValueError, RecursionError):
                    plain = stream_error(sse.data, "error") if sse.event == "error" else None  # words as plain text
                    raise plain or ActionFailed("malformed_transport", "chat completion: a server-sent event is not JSON") from None
                failed = stream_error(chunk, sse.event if sse.event != "message" else None)
                if failed is not None:
                    raise failed
                for ch in chunk.get("choices") or []:
                    said, thought = delta_text(ch.get("delta") or {})
                    visible, reasoning = visible or bool(said), reasoning or bool(thought)
                    said_r.update(thought.encode())
                    said_c.update(said.encode())
                    if said or thought:
                        first_token = first_token if first_token is not None else now
                        last_token = now
                    if ch.get("finish_reason"):
                        finish = ch["finish_reason"]
                if chunk.get("usage"):
                    usage = chunk["usage"]
        if not done:
            raise ActionFailed("malformed_transport", "chat completion: the stream ended without [DONE]")
        if usage is None:
            raise ActionFailed("malformed_transport", "chat completion: no usage before [DONE]")
        out.update(finish_reason=finish, visible_output=visible, reasoning_only=reasoning and not visible,
                   prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
                   cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                   first_byte_ns=first_byte, first_token_ns=first_token, last_token_ns=last_token,
                   end_ns=_now_ns() - t0, response_bytes=total, response_sha256=digest.hexdigest(),
                   output_sha256=hashlib.sha256(said_r.digest() + said_c.digest()).hexdigest(),
                   response_head=head.decode("utf-8", "replace"))
        return out


# The reasoning channel's field, as each engine streams it: vLLM's DeltaMessage names it `reasoning`
# (vllm/entrypoints/openai/protocol.py; `reasoning_content` before 0.11), SGLang and llama.cpp's
# server `reasoning_content`. Either is reasoning; an engine that sends both sends the same text twice.
REASONING_FIELDS = ("reasoning", "reasoning_content")


def delta_text(delta: dict) -> tuple[str, str]:
    """A stream chunk's (content, reasoning) text; a field that is not a string counts as none."""
    said = delta.get("content")
    thought = next((t for f in REASONING_FIELDS if isinstance(t := delta.get(f), str) and t), "")
    return (said if isinstance(said, str) else ""), thought


def _service_urls(profile: SiteProfile) -> list[str]:
    return [svc.url for name in ("serving", "manager", "router", "monitoring")
            if (svc := getattr(profile, name)) is not None and svc.url]


def _now_ns() -> int:
    """The loop's clock in nanoseconds: the monotonic clock, or a rehearsal's virtual time."""
    return int(anyio.current_time() * 1e9)


def _keep(folder: Path, sha256: str, content: bytes) -> Path:
    """Writes `content` to folder/sha256 once (write to a temporary name, fsync, rename)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / sha256
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256:
        return path
    tmp = folder / f".{sha256}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
