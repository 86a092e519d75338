"""A pure, in-memory host that answers the window policy's actions, for policy tests.

It is deliberately simple (no HTTP, no cache model): it lets the policy's rules be tested on
their own, with faults and timing chosen by each test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from flare_diag.events.schema import (
    ActionDone, ActionRequested, CancelRequested, Decision, Input, RequestDone, Tick, WatchObserved, WindowOpened,
)
from flare_diag.policies.plan import decode_plan
from flare_diag.policies.window import WindowPolicy

PLAN_PATH = Path(__file__).resolve().parent.parent / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"
S = 1_000_000_000


def plan_builtins(**timing) -> dict:
    plan = msgspec.to_builtins(decode_plan(PLAN_PATH.read_bytes()))
    plan["timing"].update(timing)
    return plan


class World:
    """Answers actions; time advances by each action's cost. Tests tweak attributes to inject faults."""

    def __init__(self, plan: dict, request_s: float = 15.0, reuse_on: set[str] | None = None,
                 body_s: list[float] | None = None) -> None:
        self.plan = plan
        self.now = 0
        self.request_s = request_s
        self.body_s = body_s  # per body index (cycled): a request's cost, instead of request_s
        self.reuse_on = reuse_on if reuse_on is not None else {"A.reverse_replay"}
        ident = dict(plan["identity"])
        ident.pop("gpu_count"), ident.pop("gpu_power_limit_w")
        self.base_identity = {**ident, "trace_enabled": False,
                              "gpus": [{"uuid": f"GPU-{i}", "power_limit_w": 300} for i in range(2)]}
        self.loaded = {"recipe": "glm-incumbent", "sha256": "inc-sha", "incarnation": "i0"}
        self.incarnations = 0
        self.counters = self._zero()
        self.gauges = self._gauges()
        self.trace = False
        self.fail: dict[str, str] = {}          # action -> error class, answered once
        self.request_error: dict[int, str] = {}  # nth request (1-based) -> error class
        self.request_status: dict[int, int] = {}  # nth request (1-based) -> the HTTP status its error answered
        # what /health answered after a failure the runner asks it after (a transport failure of a call to the
        # engine): nth request -> its answer, and action -> its answer for an injected `fail`
        self.request_health: dict[int, int | str] = {}
        self.fail_health: dict[str, int | str] = {}
        self.requests_sent = 0
        self.miscounts = False  # restores fail and are counted as reused anyway (a KV connector's failed loads)
        self.completion_tokens = 900  # each answer's usage; above a body's max_tokens: the body was not applied
        self.prompt_tokens = 5000  # each answer's usage; another figure later: the engine was given another prompt
        self.first_token_stamp = ""  # where each answer's first token time came from (kernel | read | "")
        self.drain_stuck = False
        self.manager_busy = False  # the manager's state says a load or unload is still running
        self.identity_override: dict = {}
        self.admitted = True
        self.pool: Callable[[World, str], float | None] = lambda _w, _n: 0.0  # every guard's value: healthy
        self.watch_silent: set[str] = set()
        self.engine_down = False  # /health answers 503
        # each request's own usage.prompt_tokens_details.cached_tokens: None (not reported), "true" (the
        # reuse its counters moved by), or a number the engine claims whatever the counters say
        self.cached_tokens: str | int | None = None
        # (asked, answered) models each answer names, as an engine whose answers name the model that served
        # them (vLLM's) records them; ("", "") for one whose answers witness nothing. `answered_as` maps the
        # request's number to another model it is answered as (a backend the window did not verify)
        self.models = ("", "")
        self.answered_as: dict[int, str] = {}
        # each answer's completion id is its own, unless a gateway answers exact bodies from its store (`replays`):
        # then a body's every later answer is its first one again, id and all
        self.replays = False
        self.counting = True  # False: /metrics is an idle twin's, which none of the window's requests move
        self.uncounted: set[int] = set()  # the actions whose answers the engine's counters left out
        self.first_answer: dict[str, str] = {}  # body sha256 -> the id of its first answer
        # the host cache is a store outside the engine that holds every body (`outlives`): a load keeps it, so a
        # fresh incarnation's first request finds one; `warm_incarnations` are those whose first request found one
        self.outlives = False
        self.touched: set[str] = set()
        self.warm_incarnations: set[str] = set()

    @staticmethod
    def _zero() -> dict:
        return {k: 0 for k in ("host_lookups", "host_hits", "host_fetched_tokens", "host_reused_tokens",
                               "gpu_hits", "gpu_reused_tokens", "finished", "generation_tokens")}

    def _gauges(self) -> dict:
        return {"requests_active": 0, "requests_pending": 0, "requests_retiring": 0, "host_transfers_inflight": 0,
                "host_transfers_waiting": 0, "host_cache_records": 0, "host_cache_bytes_used": 0,
                "host_cache_bytes_capacity": self.plan["identity"]["host_cache_bytes"], "resident_bytes": 10 * 2**30}

    def identity(self) -> dict:
        return {**self.base_identity, "recipe_sha256": self.loaded["sha256"] if self.loaded else None,
                "incarnation": self.loaded["incarnation"] if self.loaded else None,
                "trace_enabled": self.trace, **self.identity_override}

    def labels(self) -> dict:
        i = self.identity()
        return {k: i.get(k) for k in ("image", "flare_commit", "package", "model", "incarnation", "recipe_sha256")}

    def answer(self, d: ActionRequested) -> Input:
        a, args = d.action, d.args
        self.now += int(0.2 * S)
        err = self.fail.pop(a, None) or self.fail.pop(f"{a}:{args.get('what') or args.get('op') or args.get('label') or ''}", None)
        if err:
            return ActionDone(at_ns=self.now, action_id=d.action_id, ok=False, error=err, detail=f"injected {err}",
                              health_after=self.fail_health.get(a))
        data: dict = {}
        if a == "validate_fixtures":
            data = {"fixtures": {"c1-52": {"count": 52, "sha256": [f"b{i:02d}" for i in range(52)]},
                                 "tok1024": {"count": 8, "sha256": [f"t{i}" for i in range(8)]}}}
        elif a == "snapshot":
            w = args["what"]
            data = {"incumbent": lambda: {**self.loaded, "identity": self.identity(), "busy": self.manager_busy},
                    "router": lambda: {"config_sha256": "router-1", "backend": {"id": "primary", "admitted": self.admitted, "inflight": 0}},
                    "monitoring": lambda: {"target": {"id": "primary", "registered": True, "healthy": True}},
                    "gpu": lambda: {"gpus": self.base_identity["gpus"], "xid_events": []},
                    "configuration": lambda: {"site_sha256": "site"}}[w]()
        elif a == "retain_recipe":
            sha = {"glm-incumbent": "inc-sha"}.get(args["recipe"], "cand-sha")
            data = {"recipe": args["recipe"], "sha256": sha, "bytes": 100}
        elif a == "preview":
            data = {"ok": True, "steps": [args["op"]]}
        elif a == "quiesce":
            self.admitted = False
        elif a == "readmit":
            self.admitted = True
            data = {"admitted": True}
        elif a == "scrape_metrics":
            g = dict(self.gauges)
            if self.drain_stuck:
                g["requests_active"] = 1
            data = {"counters": dict(self.counters), "gauges": g, "labels": self.labels()}
        elif a == "unload":
            self.loaded = None
        elif a == "load":
            self.incarnations += 1
            self.now += int(60 * S)
            self.loaded = {"recipe": args["recipe"], "sha256": args["sha256"], "incarnation": f"i{self.incarnations}"}
            self.counters = self._zero()
            data = {"incarnation": self.loaded["incarnation"]}
        elif a == "read_identity":
            data = self.identity()
        elif a == "set_trace":
            self.trace = args["enabled"]
            data = self.identity()
        elif a == "health":
            data = {"status": 503 if self.engine_down else 200}
        elif a == "manager_state":
            data = {"loaded": self.loaded, "busy": self.manager_busy}
        elif a == "steady_state":
            data = {"when": args["when"], "guards": {n: self.guard_answer(n) for n in args["queries"]}}
        elif a == "send_request":
            return self._request(d)
        return ActionDone(at_ns=self.now, action_id=d.action_id, ok=True, data=data)

    def guard_answer(self, name: str) -> dict:
        """What Prometheus answers for a guard now: `pool(world, name)` is its value, None for no series."""
        v = self.pool(self, name)
        return {"values": [] if v is None else [v], "series": 0 if v is None else 1}

    def _request(self, d: ActionRequested) -> RequestDone:
        self.requests_sent += 1
        cost = self.body_s[d.args["body_index"] % len(self.body_s)] if self.body_s else self.request_s
        self.now += int(cost * S)
        args = d.args
        err = self.request_error.get(self.requests_sent)
        body = args["body_sha256"] or str(args["body_index"])
        # the engine counts what it serves: not what a gateway answered from its store, nor anything the
        # window reads when /metrics is another engine's
        counted = self.counting and not (self.replays and body in self.first_answer)
        counters = self.counters if counted else dict(self.counters)
        if not counted:
            self.uncounted.add(d.action_id)
        counters["host_lookups"] += 1
        hit = args["phase"] in self.reuse_on or self.outlives
        incarnation = self.loaded["incarnation"] if self.loaded else ""
        if hit and incarnation not in self.touched:
            self.warm_incarnations.add(incarnation)
        self.touched.add(incarnation)
        if hit:
            counters["host_hits"] += 1
            counters["host_fetched_tokens"] += 0 if self.miscounts else 1000
            counters["host_reused_tokens"] += 1000
        counters["gpu_hits"] += 256  # tokens found (contract section 1), all of them skipped
        counters["gpu_reused_tokens"] += 256
        if not err:
            counters["finished"] += 1
            counters["generation_tokens"] += self.completion_tokens
        reused = 256 + (1000 if hit else 0)
        cached = reused if self.cached_tokens == "true" else self.cached_tokens
        common = dict(at_ns=self.now, action_id=d.action_id, phase=args["phase"], order_index=args["order_index"],
                      body_index=args["body_index"], body_sha256=args["body_sha256"])
        if err:
            return RequestDone(**common, outcome="error", error=err, detail=f"injected {err}",
                               status_code=self.request_status.get(self.requests_sent),
                               health_after=self.request_health.get(self.requests_sent))
        length = args["body_index"] % 5 == 0
        total = int(cost * S)
        return RequestDone(**common, outcome="ok", finish_reason="length" if length else "stop",
                           visible_output=not (length and args["body_index"] % 10 == 0),
                           prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens, first_byte_ns=total // 5,
                           first_token_ns=total // 4, last_token_ns=total - 1000, end_ns=total,
                           cached_tokens=cached, first_token_stamp=self.first_token_stamp, model_asked=self.models[0],
                           model_answered=self.answered_as.get(self.requests_sent, self.models[1]),
                           answer_id=self._answer_id(body))

    def _answer_id(self, body: str) -> str:
        first = self.first_answer.setdefault(body, f"answer-{self.requests_sent}")
        return first if self.replays else f"answer-{self.requests_sent}"


Hook = Callable[[World, list[tuple[Input, list[Decision]]]], Input | None]


WATCH_EVERY = 5 * S  # as the runner's watchers poll


def opened_input(plan: dict, window_id: str = "w-test") -> WindowOpened:
    """The window's first input, decided by this build as the runner records it (an audit replays it)."""
    from flare_diag.daemon.window.setup import policy_version
    return WindowOpened(at_ns=0, window_id=window_id, plan=plan, plan_sha256="p", site="test", gpu_source="sim",
                        rehearsal=True, candidate_recipe="glm-candidate", policy_sha256=policy_version())


def drive(policy: WindowPolicy, world: World, hook: Hook | None = None, max_steps: int = 20_000,
          window_id: str = "w-test", opened: Callable[[WindowOpened], WindowOpened] | None = None,
          ) -> list[tuple[Input, list[Decision]]]:
    """Runs a window to its close; `hook` may inject an extra input before each answer. The GPU and
    router watchers answer every WATCH_EVERY of world time (`world.watch_silent` mutes them)."""
    history: list[tuple[Input, list[Decision]]] = []
    queue: list[ActionRequested] = []
    last_watch = [0]

    def watches(until: int) -> None:
        while last_watch[0] + WATCH_EVERY < until and not policy.closed:
            last_watch[0] += WATCH_EVERY
            if policy.steady_state and "prometheus" not in world.watch_silent:
                for g in policy.plan.guards:  # every guard at the watch's pace (the runner's is interval_s)
                    feed(WatchObserved(at_ns=last_watch[0], source="prometheus",
                                       data={"guard": g.name, **world.guard_answer(g.name)}))
            for src in ("gpu", "router"):
                if src in world.watch_silent:
                    continue
                data = ({"xid_events": [], "gpus": [{"uuid": "GPU-0", "memory_used_bytes": 1, "memory_total_bytes": 2}]}
                        if src == "gpu" else {"config_sha256": "router-1",
                                              "backend": {"id": "primary", "admitted": world.admitted, "inflight": 0}})
                feed(WatchObserved(at_ns=last_watch[0], source=src, data=data))

    def feed(inp: Input) -> None:
        ds = policy.receive(inp)
        history.append((inp, ds))
        for d in ds:
            if isinstance(d, ActionRequested):
                queue.append(d)
            elif isinstance(d, CancelRequested):
                for q in list(queue):
                    if q.action_id in d.action_ids:
                        queue.remove(q)
                        feed(RequestDone(at_ns=world.now, action_id=q.action_id, phase=q.args.get("phase", ""),
                                         order_index=q.args.get("order_index", 0), body_index=q.args.get("body_index", 0),
                                         body_sha256=q.args.get("body_sha256", ""), outcome="cancelled")
                             if q.action == "send_request" else
                             ActionDone(at_ns=world.now, action_id=q.action_id, ok=False, error="cancelled"))

    first = opened_input(world.plan, window_id)
    feed(opened(first) if opened else first)
    for _ in range(max_steps):
        if policy.closed:
            return history
        if hook is not None:
            extra = hook(world, history)
            if extra is not None:
                feed(extra)
                continue
        if queue:
            res = world.answer(queue.pop(0))
            watches(res.at_ns)
            if not policy.closed:
                feed(res)
            continue
        wake = policy.next_wakeup_ns()
        assert wake is not None, "policy waits for nothing but is not closed"
        world.now = max(world.now, wake)
        watches(world.now)
        if not policy.closed:
            feed(Tick(at_ns=world.now))
    raise AssertionError("window did not close")


def decisions(history, kind=None) -> list[Decision]:
    return [d for _i, ds in history for d in ds if kind is None or isinstance(d, kind)]
