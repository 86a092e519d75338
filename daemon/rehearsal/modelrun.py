"""Model runs: the window policy against flaresim's host model, driven event by event, for forecasts.

A rehearsal serves flaresim over HTTP in this process and keeps a hash-chained log: a few seconds of
CPU a window, which is right for evidence and far too slow for `plan forecast --simulate 200`. A model
run drives the same `WindowPolicy` against the same host model (flaresim's `Host`, incarnations, host
cache and keyed service-time noise, so a seed gives a request the same service time here as in a
rehearsal) through a discrete-event loop in virtual time, carrying each action out through the runner's
own handlers (`Actions`, daemon/hosts/actions.py) over the host model's ports (daemon/hosts/model.py):
one more adapter set, whose waits are moments on this loop. No HTTP, no log, no report: a model run is a forecast's
sample, never evidence. What it does not model: response bytes and answers' text (a consistency phase
sees one stand-in answer per body, as from a sound build) and faults. `tests/test_model_run.py` holds
it to a full rehearsal of the same plan and seed.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from flare_diag.daemon.hosts.actions import Actions
from flare_diag.daemon.hosts.errors import ActionFailed
from flare_diag.daemon.hosts.fixture import Fixture
from flare_diag.daemon.hosts.model import At, model_host, scraped
from flare_diag.daemon.hosts.site import sim_site
from flare_diag.daemon.window.runner import WATCH_EVERY_S
from flare_diag.events import actions as act
from flare_diag.events.schema import ActionDone, ActionRequested, CancelRequested, Input, RequestDone, Tick, WatchObserved
from flare_diag.events.window_fold import WindowFold
from flare_diag.policies.plan import Plan
from flare_diag.policies.planner import Calibration
from flare_diag.policies.window import WindowPolicy

S = 1_000_000_000
__all__ = ["ModelResult", "ModelRun", "scraped"]


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
    step: Coroutine[At, None, Input]
    done: bool = False


class ModelRun:
    """One window of `plan` against a fresh simulated host of `scenario`, its noise drawn from `seed`."""

    def __init__(self, plan_raw: bytes, plan: Plan, scenario, fixtures: dict[str, Fixture], seed: int,
                 calibration: Calibration | None = None) -> None:
        from flare_diag.daemon.simulator import Host, chunk_tokens  # the simulator, as a rehearsal serves it
        self.plan_raw, self.plan, self.fixtures, self.seed = plan_raw, plan, fixtures, seed
        self.calibration = calibration
        self.now = 0  # ns on the window clock (the window opens at 0, as a rehearsal's does)
        self.sim = Host(scenario, token="", clock=lambda: self.now / S, seed=seed)
        self.site = sim_site("http://flaresim.model", "")
        # the same actions a rehearsal's runner carries out, on the host model's ports
        self.actions = Actions(model_host(self.sim, lambda: self.now, chunk_tokens()), self.site, fixtures,
                               hashlib.sha256(plan_raw).hexdigest())
        self._handlers = self.actions.handlers()
        self.policy = WindowPolicy()
        self.fold = WindowFold()
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._n = itertools.count()
        self._seq = itertools.count(1)
        self._actions: dict[int, _Action] = {}
        self._seen_xids: int | None = None

    def handlers(self) -> dict[type[act.Action], Callable[[dict], Any]]:
        """Each action type (events/actions.py) to what carries it out: the runner's own (`Actions`)."""
        return self._handlers

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
                        self._answer(a, _failed(a.d, self.now, "cancelled", "cancelled by the policy", cancelled=True))

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
        """The GPU and router watches, as the runner polls them every WATCH_EVERY_S (their ports answer at once)."""
        host = self.actions.host
        g = _at_once(host.gpu.view())
        xids = g["xid_events"]
        new = xids[self._seen_xids:] if self._seen_xids is not None else []
        self._seen_xids = len(xids)
        self._feed(WatchObserved(at_ns=self.now, source="gpu", data={"xid_events": new, "gpus": g["gpus"]}))
        if not self.policy.closed:
            self._feed(WatchObserved(at_ns=self.now, source="router", data=_at_once(host.router.snapshot())))
        self._at(self.now + int(WATCH_EVERY_S * S), self._watch)

    # --- actions: each a coroutine of the shared handlers, stepped at the moments its ports wait for
    def _start(self, d: ActionRequested) -> None:
        a = self._actions[d.action_id] = _Action(d, self._carry_out(d))
        if d.deadline_s:
            self._at(self.now + int(d.deadline_s * S), lambda: self._answer(a, _failed(
                d, self.now, "timeout", f"{d.action}: no answer within its deadline of {d.deadline_s:g} s")))
        self._step(a)

    async def _carry_out(self, d: ActionRequested) -> Input:
        try:
            data = await self._handlers[type(d.request)](d.args)
        except ActionFailed as f:
            return _failed(d, self.now, f.error, f.detail)
        if d.action == "send_request":
            return RequestDone(at_ns=self.now, action_id=d.action_id, **_req_ids(d.args), **data)
        return ActionDone(at_ns=self.now, action_id=d.action_id, ok=True, data=data)

    def _step(self, a: _Action) -> None:
        """Runs the action's coroutine to its next wait; an action answered already (its deadline, a
        cancel) still runs to its end, as the host's work goes on after nobody waits for it."""
        try:
            wait = a.step.send(None)
        except StopIteration as end:
            self._answer(a, end.value)
            return
        self._at(wait.ns, lambda: self._step(a))

    def _answer(self, a: _Action, inp: Input) -> None:
        if a.done:
            return
        a.done = True
        self._actions.pop(a.d.action_id, None)
        self._feed(inp)


def _at_once(coro: Coroutine[At, None, Any]) -> Any:
    """A port call that takes no time (a read), run to its answer."""
    try:
        coro.send(None)
    except StopIteration as end:
        return end.value
    coro.close()
    raise RuntimeError("model run: a read of the host model waited for time")


def _failed(d: ActionRequested, now: int, error: str, detail: str, cancelled: bool = False) -> Input:
    if d.action == "send_request":
        return RequestDone(at_ns=now, action_id=d.action_id, **_req_ids(d.args),
                           outcome="cancelled" if cancelled else "error", error=None if cancelled else error, detail=detail)
    return ActionDone(at_ns=now, action_id=d.action_id, ok=False, error=error, detail=detail)


def _req_ids(args: dict) -> dict:
    return {"phase": args["phase"], "order_index": args["order_index"], "body_index": args["body_index"],
            "body_sha256": args["body_sha256"]}
