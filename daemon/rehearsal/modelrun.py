"""Model runs: the window policy against flaresim's host model, driven event by event, for forecasts.

A rehearsal serves flaresim over HTTP in this process and keeps a hash-chained log: a few seconds of
CPU a window, which is right for evidence and far too slow for `plan forecast --simulate 200`. A model
run drives the same `WindowPolicy` against the same host model (flaresim's `Host`, incarnations, host
cache and keyed service-time noise, so a seed gives a request the same service time here as in a
rehearsal) through a discrete-event loop in virtual time, answering each action with the data the
`Target` would read from the simulator's API. No HTTP, no log, no report: a model run is a forecast's
sample, never evidence. What it does not model: response bytes and answers' text (a consistency phase
sees one stand-in answer per body, as from a sound build) and faults. `tests/test_model_run.py` holds
it to a full rehearsal of the same plan and seed.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from prometheus_client.samples import Sample

from flare_diag.daemon.hosts import metrics
from flare_diag.daemon.hosts.errors import ActionFailed, classify_response
from flare_diag.daemon.hosts.fixture import Fixture
from flare_diag.daemon.window.runner import WATCH_EVERY_S
from flare_diag.daemon.hosts.site import sim_site
from flare_diag.daemon.hosts.target import fixture_model, preflight_body
from flare_diag.events import actions as act
from flare_diag.events.schema import ActionDone, ActionRequested, CancelRequested, Input, RequestDone, Tick, WatchObserved
from flare_diag.events.window_fold import WindowFold
from flare_diag.policies.plan import Plan
from flare_diag.policies.planner import Calibration
from flare_diag.policies.window import WindowPolicy

S = 1_000_000_000
_PARSED: dict[bytes, dict] = {}


@dataclass
class ModelResult:
    """What one model run ended with: the fold the report would read."""

    seed: int
    outcome: str | None
    cells: dict[str, dict]
    restoration: dict | None
    minute: float | None


@dataclass
class _Action:
    d: ActionRequested
    done: bool = False


class ModelRun:
    """One window of `plan` against a fresh simulated host of `scenario`, its noise drawn from `seed`."""

    def __init__(self, plan_raw: bytes, plan: Plan, scenario, fixtures: dict[str, Fixture], seed: int,
                 calibration: Calibration | None = None) -> None:
        from flare_diag.daemon.simulator import Host, chunk_tokens  # the simulator, as a rehearsal serves it
        self._chunk = chunk_tokens()
        self.plan_raw, self.plan, self.fixtures, self.seed = plan_raw, plan, fixtures, seed
        self.calibration = calibration
        self.now = 0  # ns on the window clock (the window opens at 0, as a rehearsal's does)
        self.host = Host(scenario, token="", clock=lambda: self.now / S, seed=seed)
        self.site = sim_site("http://flaresim.model", "")
        self.policy = WindowPolicy()
        self.fold = WindowFold()
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._n = itertools.count()
        self._seq = itertools.count(1)
        self._actions: dict[int, _Action] = {}
        self._seen_xids: int | None = None

    # --- the loop
    def _at(self, t_ns: int, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (t_ns, next(self._n), fn))

    def _feed(self, inp: Input) -> None:
        decisions = self.policy.receive(inp)
        for ev in (inp, *decisions):
            self.fold.apply(next(self._seq), ev)
        for d in decisions:
            if isinstance(d, ActionRequested):
                self._start(d)
            elif isinstance(d, CancelRequested):
                for aid in d.action_ids:
                    a = self._actions.get(aid)
                    if a is not None and not a.done:
                        self._answer(a, self._failed(a.d, "cancelled", "cancelled by the policy", cancelled=True))

    def run(self) -> ModelResult:
        from flare_diag.daemon.window.setup import WindowSetup
        setup = WindowSetup(self.plan_raw, self.plan, self.site, self.fixtures, rehearsal=True,
                            calibration=self.calibration, clock="virtual", sim_seed=self.seed)
        self._feed(setup.opened(f"model-{self.seed}"))
        self._at(int(WATCH_EVERY_S * S), self._watch)
        while not self.policy.closed:
            wake = self.policy.next_wakeup_ns()
            if wake is not None and (not self._heap or wake < self._heap[0][0]):
                self.now = max(self.now, wake)
                self._feed(Tick(at_ns=self.now))
                continue
            if not self._heap:
                raise RuntimeError("model run: the policy waits for nothing and is not closed")
            t, _n, fn = heapq.heappop(self._heap)
            self.now = max(self.now, t)
            fn()
        f = self.fold
        return ModelResult(self.seed, f.outcome, f.cells, f.restoration, f.minute)

    def _watch(self) -> None:
        """The GPU and router watches, as the runner polls them every WATCH_EVERY_S."""
        xids = self.host.xid_events
        new = xids[self._seen_xids:] if self._seen_xids is not None else []
        self._seen_xids = len(xids)
        self._feed(WatchObserved(at_ns=self.now, source="gpu", data={"xid_events": new, "gpus": self.host.gpu_list()}))
        if not self.policy.closed:
            self._feed(WatchObserved(at_ns=self.now, source="router", data=self._router()))
        self._at(self.now + int(WATCH_EVERY_S * S), self._watch)

    # --- actions
    def handlers(self) -> dict[type[act.Action], Callable[[_Action], None]]:
        """Each action type (events/actions.py) to the model's answer to it."""
        return {act.ValidateFixtures: self._validate_fixtures, act.Snapshot: self._snapshot,
                act.RetainRecipe: self._retain_recipe, act.Preview: self._preview, act.Quiesce: self._quiesce,
                act.Readmit: self._readmit, act.Unload: self._unload, act.Load: self._load,
                act.ReadIdentity: self._read_identity, act.ScrapeMetrics: self._scrape_metrics,
                act.SetTrace: self._set_trace, act.ManagerState: self._manager_state, act.Health: self._health,
                act.Preflight: self._preflight, act.SendRequest: self._send_request,
                act.SteadyState: self._steady_state}

    def _steady_state(self, a: _Action) -> None:
        # a model run has no Prometheus: its windows open without the guards (WindowOpened.steady_state)
        raise ActionFailed("not_applicable", "a model run has no Prometheus to evaluate guards on")

    def _start(self, d: ActionRequested) -> None:
        a = self._actions[d.action_id] = _Action(d)
        if d.deadline_s:
            self._at(self.now + int(d.deadline_s * S), lambda: self._answer(a, self._failed(
                d, "timeout", f"{d.action}: no answer within its deadline of {d.deadline_s:g} s")))
        handler = self.handlers().get(type(d.request))
        if handler is None:
            self._answer(a, self._failed(d, "internal_error", f"{d.action}: not modelled"))
            return
        try:
            handler(a)
        except ActionFailed as f:
            self._answer(a, self._failed(d, f.error, f.detail))

    def _answer(self, a: _Action, inp: Input) -> None:
        if a.done:
            return
        a.done = True
        self._actions.pop(a.d.action_id, None)
        self._feed(inp)

    def _ok(self, a: _Action, data: dict, after_s: float = 0.0, then: Callable[[], None] | None = None) -> None:
        def finish() -> None:
            if then is not None:
                then()
            self._answer(a, ActionDone(at_ns=self.now, action_id=a.d.action_id, ok=True, data=data))
        if after_s <= 0 and then is None:
            finish()
        else:
            self._at(self.now + int(after_s * S), finish)

    def _failed(self, d: ActionRequested, error: str, detail: str, cancelled: bool = False) -> Input:
        if d.action == "send_request":
            return RequestDone(at_ns=self.now, action_id=d.action_id, **_req_ids(d.args),
                               outcome="cancelled" if cancelled else "error", error=None if cancelled else error, detail=detail)
        return ActionDone(at_ns=self.now, action_id=d.action_id, ok=False, error=error, detail=detail)

    @staticmethod
    def _http(status: int, etype: str, message: str, what: str) -> ActionFailed:
        return classify_response(httpx.Response(status, json={"error": {"type": etype, "message": message}}), what)

    def _validate_fixtures(self, a: _Action) -> None:
        self._ok(a, {"fixtures": {n: f.work() for n, f in self.fixtures.items() if n in a.d.args.get("fixtures", [])}})

    def _loaded(self) -> dict | None:
        e = self.host.engine
        return {"recipe": e.recipe, "sha256": e.recipe_sha256, "incarnation": e.incarnation} if e else None

    def _router(self) -> dict:
        return {"config_sha256": self.host.router_config_sha, "backend": self.host.backend}

    def _snapshot(self, a: _Action) -> None:
        what = a.d.args["what"]
        if what == "incumbent":
            loaded = self._loaded()
            if not loaded:
                raise ActionFailed("no_incumbent", "the manager reports no recipe loaded")
            self._ok(a, {**loaded, "identity": self.host.identity()})
        elif what == "router":
            self._ok(a, self._router())
        elif what == "monitoring":
            self._ok(a, {"target": {**self.host.monitoring, "healthy": bool(self.host.engine)}})
        elif what == "gpu":
            self._ok(a, {"gpus": self.host.gpu_list(), "xid_events": self.host.xid_events})
        elif what == "configuration":
            self._ok(a, {"site": self.site.name, "site_sha256": self.site.sha256, "plan_sha256": _sha(self.plan_raw)})
        else:
            raise ActionFailed("internal", f"unknown snapshot {what!r}")

    def _retain_recipe(self, a: _Action) -> None:
        name = a.d.args["recipe"]
        if name not in self.host.recipes:
            raise self._http(404, "not_found", f"no recipe {name!r}", f"recipe {name}")
        content = self.host.recipes[name]
        sha = hashlib.sha256(content).hexdigest()
        expect = a.d.args.get("expect_sha256")
        if expect is not None and sha != expect:
            raise ActionFailed("identity_drift", f"recipe {name}: its bytes hash to {sha[:12]}, the loaded recipe is {str(expect)[:12]}")
        self._ok(a, {"recipe": name, "sha256": sha, "bytes": len(content)})

    def _health(self, a: _Action) -> None:
        self._ok(a, {"status": 200 if self.host.engine else 503})

    def _preview(self, a: _Action) -> None:
        args = a.d.args
        name = args["recipe"]
        if name not in self.host.recipes:
            raise self._http(404, "not_found", f"no recipe {name!r}", "preview")
        if args.get("sha256") not in (None, self.host.sha(name)):
            raise self._http(409, "conflict", "sha256 does not match the stored bytes", "preview")
        steps = ["drain", "stop engine", "release GPUs"] if args["op"] == "unload" else \
            ["verify recipe bytes", "start engine", "warm up", "ready"]
        self._ok(a, {"ok": True, "steps": steps})

    def _backend_op(self, a: _Action, admitted: bool) -> None:
        self.host.backend = {**self.host.backend, "admitted": admitted, "inflight": 0}
        self._ok(a, dict(self.host.backend))

    def _quiesce(self, a: _Action) -> None:
        self._backend_op(a, False)

    def _readmit(self, a: _Action) -> None:
        self._backend_op(a, True)

    def _scrape_metrics(self, a: _Action) -> None:
        self._ok(a, scraped(self.host))

    def _recipe_checked(self, a: _Action, what: str) -> str:
        name, sha = a.d.args.get("recipe"), a.d.args.get("sha256")
        if name not in self.host.recipes:
            raise self._http(404, "not_found", f"no recipe {name!r}", what)
        if sha != self.host.sha(name):
            raise self._http(409, "conflict", f"sha256 does not match the stored bytes of {name!r}", what)
        return name

    def _unload(self, a: _Action) -> None:
        self._recipe_checked(a, "unload")
        e = self.host.engine
        if e is not None and e.recipe_sha256 != a.d.args["sha256"]:
            raise self._http(409, "conflict", "that recipe is not the one loaded", "unload")
        self.host.busy = True

        def done() -> None:
            self.host.unload()
            self.host.busy = False
        self._ok(a, {"ok": True}, 5 * self.host.unload_noise(), done)

    def _load(self, a: _Action) -> None:
        name = self._recipe_checked(a, "load")
        self.host.busy = True
        data: dict = {}

        def done() -> None:
            data["incarnation"] = self.host.load(name).incarnation
            self.host.busy = False
        self._ok(a, data, self.host.sc.load_s * self.host.load_noise(), done)

    def _read_identity(self, a: _Action) -> None:
        self._ok(a, self.host.identity())

    def _set_trace(self, a: _Action) -> None:
        if self.host.engine is None:
            raise self._http(503, "unavailable", "no incarnation loaded", "trace")
        self.host.engine.trace_enabled = bool(a.d.args["enabled"])
        self._ok(a, self.host.identity())

    def _manager_state(self, a: _Action) -> None:
        self._ok(a, {"loaded": self._loaded(), "busy": self.host.busy})

    # --- generations, as flaresim's chat handler paces them
    def _generation(self, a: _Action, raw: bytes, what: str, routed: bool,
                    answer: Callable[[object, int], Input]) -> None:
        h = self.host
        h.requests_seen += 1
        if routed and not h.backend["admitted"]:
            raise self._http(503, "unavailable", "no admitted backend", what)
        e = h.engine
        if e is None or h.crashed:
            raise self._http(503, "unavailable", "no incarnation loaded", what)
        parsed = _PARSED.get(raw)
        if parsed is None:
            if len(_PARSED) > 4096:
                _PARSED.clear()
            parsed = _PARSED[raw] = json.loads(raw)  # the same bodies, run after run
        p = e.plan(raw, parsed)
        k = h.request_noise(e, p.seed)
        p.restore_s, p.prefill_s, p.decode_s = p.restore_s * k, p.prefill_s * k, p.decode_s * k
        e.active += 1
        if p.restore_s:
            e.transfers_inflight += 1
        t0 = self.now
        restored_at = t0 + int(p.restore_s * S)
        prefilled_at = restored_at + int(p.prefill_s * S)
        state: dict = {}

        def restored() -> None:
            if p.restore_s:
                e.transfers_inflight -= 1

        def prefilled() -> None:
            state["pinned"] = e.after_prefill(p)

        def finished() -> None:
            if e is h.engine:
                e.finish(p, state["pinned"])
                e.resident_bytes += h.creep_bytes
            e.active -= 1
            h.requests_done += 1
            self._answer(a, answer(p, t0))

        self._at(restored_at, restored)
        self._at(prefilled_at, prefilled)
        self._at(prefilled_at + _ns_sum(p.decode_s, p.gen.total, self._chunk), finished)

    def _send_request(self, a: _Action) -> None:
        args = a.d.args
        fx = self.fixtures[args["fixture"]]
        raw = fx.bodies[args["body_index"]]

        def answer(p, t0: int) -> Input:
            restore_prefill = int(p.restore_s * S) + int(p.prefill_s * S)
            first = restore_prefill + int(p.decode_s / max(p.gen.total, 1) * min(self._chunk, p.gen.total) * S)
            end = self.now - t0
            return RequestDone(
                at_ns=self.now, action_id=a.d.action_id, **_req_ids(args), outcome="ok",
                request_id=None, status_code=200,  # the policy reads neither the id nor the bytes of an answer
                finish_reason=p.gen.finish_reason, visible_output=p.gen.content_tokens > 0,
                reasoning_only=p.gen.reasoning_tokens > 0 and p.gen.content_tokens == 0,
                prompt_tokens=p.prompt_len, completion_tokens=p.gen.total,
                cached_tokens=max(p.lookup.reused, p.lookup.gpu_hit_tokens),
                first_byte_ns=first, first_token_ns=first if p.gen.total else None, last_token_ns=end, end_ns=end,
                # the model holds no answers' text: a sound build's stand-in, one per body, so that a
                # consistency phase is forecast as it runs on a sound host (consistent)
                output_sha256=_sha(raw))
        self._generation(a, raw, "chat completion", False, answer)

    def _preflight(self, a: _Action) -> None:
        routed = a.d.args["path"] == "routed"

        def answer(p, _t0: int) -> Input:
            return ActionDone(at_ns=self.now, action_id=a.d.action_id, ok=True,
                              data={"finish_reason": p.gen.finish_reason, "request_id": None})
        self._generation(a, preflight_body(fixture_model(self.fixtures)), f"{a.d.args['path']} preflight", routed, answer)


def scraped(host) -> dict:
    """What `Target.scrape_metrics` reads from flaresim's /metrics, taken from the families the
    exposition is written from (daemon.metrics.shape on both paths; only the text is skipped)."""
    from flare_diag.daemon.simulator import families
    fams = families(host)
    parsed: dict[str, list] = {}
    for name, kind, _help, samples in fams or ():  # a host with nothing loaded exposes no family
        if kind == "histogram":  # (sum, count), as the exposition writes them
            parsed[name] = [Sample(f"{name}_{part}", {}, float(v)) for part, (_l, v) in zip(("sum", "count"), samples)]
            continue
        sample = f"{name}_total" if kind == "counter" else name
        parsed[name] = [Sample(sample, {k: str(v) for k, v in labels.items()}, float(v)) for labels, v in samples]
    return metrics.shape(parsed)


def _ns_sum(decode_s: float, tokens: int, chunk: int) -> int:
    """A streamed answer's decode time as flaresim sleeps it: chunk by chunk, each rounded as a sleep is."""
    if tokens <= 0:
        return 0
    per_tok = decode_s / tokens
    return sum(int(per_tok * min(chunk, tokens - i) * S) for i in range(0, tokens, chunk))


def _sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _req_ids(args: dict) -> dict:
    return {"phase": args["phase"], "order_index": args["order_index"], "body_index": args["body_index"],
            "body_sha256": args["body_sha256"]}
