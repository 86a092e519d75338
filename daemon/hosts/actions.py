"""Carries out the policy's actions against a host's ports: one handler per action (events/actions.py),
written once for every kind of host (HTTP, a local engine, the host model), each returning its answer's
data or raising ActionFailed."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from flare_diag.daemon.hosts.errors import ActionFailed
from flare_diag.daemon.hosts.fixture import Fixture
from flare_diag.daemon.hosts.host import Host
from flare_diag.daemon.hosts.prometheus import Prometheus
from flare_diag.daemon.hosts.site import Site
from flare_diag.events import actions as act
from flare_diag.events import answers


def preflight_body(model: str | None) -> bytes:
    """The restore's preflight generation, naming the model the window's own bodies name (an engine
    refuses a model it does not serve: vLLM answers 404 for any other name); None: no model field.
    Streamed, so that the stall bound can tell an engine that holds it from a slow one (Target.stream_short)."""
    body: dict = {"messages": [{"role": "user", "content": "preflight"}], "max_tokens": 8, "stream": True}
    return json.dumps({"model": model, **body} if model is not None else body).encode()


def fixture_model(fixtures: dict[str, Fixture]) -> str | None:
    """The model the fixtures' bodies name (the first body that names one), or None."""
    for name in sorted(fixtures):
        for m in fixtures[name].models():
            return m
    return None


def shaped(kind: type[answers.Answer], data: dict, what: str) -> dict:
    """`data` when it reads as `kind` (events/answers.py); the host's malformed answer otherwise, naming
    the field: whoever asked (a window, a site check, a forecast's probe) meets it where the host answered."""
    try:
        answers.convert(kind, data, what)
    except answers.UnexpectedAnswer as exc:
        raise ActionFailed("malformed_transport", str(exc)) from None
    return data


class Actions:
    """The window's actions on one host: `handlers()` is the table an executor (the runner, the model run)
    carries decisions out through. Every answer from the host is checked against its struct before it is
returned (what this class builds itself, the fixtures' work and a kept recipe's digest, is already so)."""

    def __init__(self, host: Host, site: Site, fixtures: dict[str, Fixture], plan_sha256: str,
                 recipe_dir: Path | None = None, prometheus: Prometheus | None = None) -> None:
        self.host = host
        self.site = site
        self.fixtures = fixtures
        self.plan_sha256 = plan_sha256
        self.recipe_dir = recipe_dir  # retained recipe bytes, content-addressed, beside the log
        self.prometheus = prometheus  # where the plan's steady-state guards are evaluated
        self.manager, self.serving, self.engine = host.manager, host.serving, host.engine
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

    async def validate_fixtures(self, args: dict) -> dict:
        return {"fixtures": {n: f.work() for n, f in self.fixtures.items() if n in args.get("fixtures", [])}}

    async def snapshot(self, args: dict) -> dict:
        data = await self._snapshot(args["what"])
        return shaped(answers.snapshot_type(args["what"]), data, f"{args['what']} snapshot")

    async def _snapshot(self, what: str) -> dict:
        if what == "incumbent":
            st = await self.manager_state({})
            loaded = st.get("loaded")
            if not loaded:
                raise ActionFailed("no_incumbent", "the manager reports no recipe loaded")
            ident = await self.read_identity({})
            return {**loaded, "identity": ident, **({"busy": st["busy"]} if st.get("busy") is not None else {})}
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
        out: dict[str, Any] = {"recipe": name, "sha256": sha, "bytes": len(content)}
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
        return shaped(answers.SteadyState, {"when": args["when"], "guards": out}, "steady state")

    async def gpu_view(self) -> dict:
        return shaped(answers.GpuView, await self.host.gpu.view(), "GPU view")

    async def health(self, args: dict) -> dict:
        return shaped(answers.Health, await self.serving.health(), "health")

    async def preview(self, args: dict) -> dict:
        return shaped(answers.Preview, await self.manager.preview(args["op"], args["recipe"], args.get("sha256")), "preview")

    async def quiesce(self, args: dict) -> dict:
        return shaped(answers.Backend, await self.host.router.quiesce(), "quiesce")

    async def readmit(self, args: dict) -> dict:
        return shaped(answers.Backend, await self.host.router.readmit(), "readmit")

    async def scrape_metrics(self, args: dict) -> dict:
        return shaped(answers.MetricsSample, await self.serving.metrics(), "metrics")

    def host_tier(self) -> bool | None:
        """Whether the host has a tier behind the engine's own cache: known for an engine the daemon
        runs itself (its recipes' configuration), None (unknown) otherwise."""
        return None if self.engine is None else self.engine.host_tier()

    async def unload(self, args: dict) -> dict:
        return shaped(answers.Incarnation, await self.manager.unload(args["recipe"], args["sha256"]), "unload")

    async def load(self, args: dict) -> dict:
        return shaped(answers.Incarnation, await self.manager.load(args["recipe"], args["sha256"]), "load")

    async def read_identity(self, args: dict) -> dict:
        return shaped(answers.Identity, await self.serving.identity(), "identity")

    async def set_trace(self, args: dict) -> dict:
        return shaped(answers.Identity, await self.serving.trace(args["enabled"]), "trace")

    async def manager_state(self, args: dict) -> dict:
        return shaped(answers.ManagerState, await self.manager.state(), "manager state")

    async def preflight(self, args: dict) -> dict:
        body = preflight_body(await self.preflight_model())
        what = f"{args['path']} preflight"
        path = self.host.router if args["path"] == "routed" else self.serving
        return shaped(answers.Preflight, await path.complete(body, what), what)

    async def served_models(self) -> list[str] | None:
        """The engine's `GET /v1/models` ids; None when it does not answer that."""
        return await self.serving.models()

    async def openapi(self) -> dict | None:
        """The engine's published request schema (`GET /openapi.json`), where it publishes one."""
        return await self.serving.openapi()

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
        """Sends the fixture body's exact bytes and returns the RequestDone fields (raises on abort-class errors)."""
        body = self.fixtures[args["fixture"]].bodies[args["body_index"]]
        done = await self.serving.chat(body)
        if names_its_own_id(body):
            done.pop("answer_id", None)  # the body chose its answer's id: a repeat is the body's, not a replay's
        return done


# Body fields an engine names its answer after: vLLM's `request_id` (ChatCompletionRequest; the completion id
# is "chatcmpl-" + it, entrypoints/openai/chat_completion/serving.py, unless an X-Request-Id header names one),
# SGLang's `rid`. Every other answer's id is the engine's own draw.
ID_FIELDS = (b'"request_id"', b'"rid"')


def names_its_own_id(body: bytes) -> bool:
    """Whether the body may name its answer's completion id (a field an engine takes it from)."""
    return any(f in body for f in ID_FIELDS)


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
