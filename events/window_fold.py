"""The one fold of a window's log that the report, the live progress, `status` and the live view read.

Minutes are the window clock's (`events.schema.window_minute`): the same rounding everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flare_diag.events.base import Event
from flare_diag.events.schema import (
    AbortDecided,
    ActionRequested,
    Alarm,
    BoundsScaled,
    CellRecorded,
    FaultsAccounted,
    FaultScheduled,
    HarnessRehearsed,
    Input,
    PhaseStarted,
    PreservedChecked,
    RequestMeasured,
    RestorationRecorded,
    RestoreStarted,
    TimeMarked,
    TraceOrderFrozen,
    VerdictReached,
    WindowClosed,
    WindowOpened,
    window_minute,
)
from flare_diag.events.stages import Stage


class WindowFold:
    """Apply a window's events in seq order (`apply`); inputs the caller decodes itself (a report's
    narrow views) advance the clock through `saw_input`."""

    def __init__(self, window_id: str = "") -> None:
        self.window_id = window_id
        self.plan = ""
        self.starting_observation: dict[str, Any] | None = None  # what the plan sets out to reproduce
        self.trace_rule: dict[str, Any] = {}  # the plan's bounds for "trace overhead understood"
        self.guards: list[dict[str, Any]] = []  # the plan's steady-state guards, as declared
        self.steady_state = False  # whether the window evaluated them on the site's Prometheus
        self.plan_sha256: str | None = None
        self.site: str | None = None
        self.rehearsal: bool | None = None
        self.clock: dict[str, Any] = {"kind": "wall", "sim_seed": None, "time_scale": 1.0}
        self.candidate_recipe: str | None = None
        self.expected_identity: dict[str, Any] = {}
        self.timing: dict[str, Any] | None = None
        self.stage = Stage.OPENING  # a fold begins at the window's opening
        self.phase: str | None = None
        self.phase_requests = 0
        self.phase_estimated_end: float | None = None
        self.phase_specs: dict[str, dict[str, Any]] = {}
        self.fixture_sizes: dict[str, int] = {}  # bodies per fixture, once the window has validated them
        self.trace_fixture: str | None = None
        self.trace_arms = 0
        self.requests = 0
        self.t0_ns: int | None = None
        self.t0_wall: int | None = None
        self.last_at_ns = 0
        self.cells: dict[str, dict[str, Any]] = {}
        self.abort: dict[str, Any] | None = None
        self.alarms: list[dict[str, Any]] = []
        self.scaled_bounds: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []  # a rehearsal's injected faults: {"spec", "fired"} (None: not yet accounted)
        self.review: dict[str, Any] = {}  # who reviewed the plan's bytes (production plans)
        self.harness: dict[str, Any] = {}  # the offline harness's rehearsal the window relied on
        self.harness_fitted: dict[str, Any] = {}  # and the one against the model fitted to the site's earlier window
        self.preserved: dict[str, dict[str, Any]] = {}  # preserved path -> its hash before, after and whether unchanged
        self.verdict: dict[str, Any] | None = None
        self.restoration: dict[str, Any] | None = None
        self.restoration_failed: list[str] | None = None
        # an action that changes the host was asked for (quiesce, unload, load, set_trace): until then
        # there is nothing of the window's own to restore, and "restoration verified" would claim one
        self.host_changed = False
        self.outcome: str | None = None
        self.trace_order: list[str] | None = None
        self.timeline: list[dict[str, Any]] = []
        self.last_seq = 0
        self._mark_minute: float | None = None

    @property
    def stop_min(self) -> float | None:
        return (self.timing or {}).get("stop_min")

    @property
    def window_min(self) -> float | None:
        return (self.timing or {}).get("window_min")

    def minute_at(self, at_ns: int) -> float | None:
        return window_minute(at_ns, self.t0_ns)

    @property
    def minute(self) -> float | None:
        """The window minute of the latest input, or of the latest decision that named one."""
        now = self.minute_at(self.last_at_ns)
        if now is None or (self._mark_minute is not None and self._mark_minute > now):
            return self._mark_minute
        return now

    def saw_input(self, at_ns: int) -> None:
        if at_ns > self.last_at_ns:
            self.last_at_ns = at_ns

    def _mark(self, minute: float | None, event: str | None = None) -> None:
        if minute is not None:
            self._mark_minute = minute
        if event is not None:
            self.timeline.append({"minute": minute, "event": event})

    def apply(self, seq: int, ev: Event, wall_ns: int | None = None) -> None:
        self.last_seq = seq
        if isinstance(ev, Input):
            self.saw_input(ev.at_ns)
        handler = _HANDLERS.get(type(ev))
        if handler is not None:
            handler(self, ev, wall_ns)

    def _opened(self, ev: WindowOpened, _wall: int | None) -> None:
        self.window_id = ev.window_id
        self.plan = str(ev.plan.get("name", ""))
        self.plan_sha256, self.site, self.rehearsal = ev.plan_sha256, ev.site, ev.rehearsal
        self.clock = {"kind": ev.clock, "sim_seed": ev.sim_seed, "time_scale": ev.time_scale}
        self.review = dict(ev.review)
        self.phase_specs = {str(p.get("id")): p for p in ev.plan.get("phases") or [] if isinstance(p, dict)}
        self.trace_fixture = (ev.plan.get("trace") or {}).get("fixture")
        trc = ev.plan.get("trace") if isinstance(ev.plan.get("trace"), dict) else {}
        # off and on at each concurrency, each repetition (policies.plan.trace_arm_order)
        self.trace_arms = 2 * int(trc.get("repetitions") or 0) * len(trc.get("concurrency") or []) if trc else 0
        self.candidate_recipe = ev.candidate_recipe
        self.expected_identity = dict(ev.plan.get("identity") or {})
        tr = ev.plan.get("trace")
        self.trace_rule = {k: tr[k] for k in ("overhead_max", "overhead_interval_max") if isinstance(tr, dict) and k in tr}
        so = ev.plan.get("starting_observation")
        self.starting_observation = dict(so) if isinstance(so, dict) else None
        gs = ev.plan.get("guards")
        self.guards = [dict(g) for g in gs if isinstance(g, dict)] if isinstance(gs, list) else []
        self.steady_state = bool(ev.steady_state)
        t = ev.plan.get("timing") or {}
        self.timing = {"stop_min": t.get("stop_min"), "window_min": t.get("window_min"),
                       "restore_reserve_min": t.get("restore_reserve_min"), "drain_timeout_s": t.get("drain_timeout_s"),
                       "quiesce_drain_timeout_s": t.get("quiesce_drain_timeout_s"), "drain_poll_s": t.get("drain_poll_s")}

    def _time_marked(self, ev: TimeMarked, wall: int | None) -> None:
        if ev.mark == "t0":
            self.t0_ns = self.last_at_ns
            self.t0_wall = wall
            self.stage = Stage.EXPERIMENT
        self._mark(ev.minute, ev.mark)

    def _phase_started(self, ev: PhaseStarted, _wall: int | None) -> None:
        self.phase, self.phase_requests, self.phase_estimated_end = ev.phase, 0, ev.estimated_end_minute
        self._mark(ev.minute, f"phase {ev.phase} started")

    @property
    def phase_total(self) -> int | None:
        """How many requests the current phase sends, once the fixture sizes are known (None: unknown).
        The count rule is policies.planner.phase_requests' (a fold below the policies cannot import it;
        tests/test_planner.py holds the two equal on every phase of the shipped plan)."""
        if self.phase is None:
            return None
        spec = self.phase_specs.get(self.phase)
        if spec is None:  # a trace arm (or its warm-up): one pass over the trace fixture
            n = self.fixture_sizes.get(self.trace_fixture or "") if self.phase.startswith("trace.") else None
            return n
        return self._sends(spec)

    def _sends(self, spec: dict[str, Any]) -> int | None:
        if spec.get("kind") == "identity":
            return 0
        n = self.fixture_sizes.get(str(spec.get("fixture")))
        if n is None:
            return None
        last = spec.get("select_last")
        # a consistency phase sends every body twice: cold, then with the host's reuse
        return (min(n, last) if last else n) * (2 if spec.get("kind") == "consistency" else int(spec.get("passes") or 1))

    @property
    def requests_planned(self) -> int | None:
        """How many requests the whole window sends if every phase runs (the "of N" of the live view):
        every phase, the trace warm-up and every trace arm; None until the fixture sizes are known."""
        counts = [self._sends(spec) for spec in self.phase_specs.values()]
        if any(c is None for c in counts) or not self.fixture_sizes:
            return None
        total = sum(counts)  # type: ignore[arg-type]  # None excluded by the test before it
        if self.trace_fixture and self.trace_arms:
            size = self.fixture_sizes.get(self.trace_fixture)
            if size is None:
                return None
            total += size * (self.trace_arms + 1)  # the arms and their warm-up
        return total

    def count_request(self, _ev: object = None, _wall: int | None = None) -> None:
        """One request measured (a report reads these through a narrow view, and calls this)."""
        self.phase_requests += 1
        self.requests += 1

    def _cell(self, ev: CellRecorded, _wall: int | None) -> None:
        self.timeline.append({"minute": self.minute_at(self.last_at_ns), "event": f"cell {ev.phase}: {ev.status}"})
        self.cells[ev.phase] = {"phase": ev.phase, "status": ev.status, "reason": ev.reason, "requests": ev.requests,
                                "host": ev.host, "gpu": ev.gpu, "comparable": ev.comparable,
                                "natural_failures": ev.natural_failures, "started_minute": ev.started_minute,
                                "estimated_end_minute": ev.estimated_end_minute, "ended_minute": ev.ended_minute,
                                "prime": ev.prime, "incarnation_id": ev.incarnation_id,
                                "identity_held": ev.identity_held, "hit_requests": list(ev.hit_requests),
                                "drain_unseen": list(ev.drain_unseen), "not_fresh": ev.not_fresh}
        if ev.consistency is not None:  # only a consistency phase's cell carries the key
            self.cells[ev.phase]["consistency"] = ev.consistency
        if ev.phase == self.phase:
            self.phase = None

    def _abort(self, ev: AbortDecided, _wall: int | None) -> None:
        self.abort = {"reason": ev.reason, "detail": ev.detail, "minute": ev.minute}
        self._mark(ev.minute, f"abort: {ev.reason}")

    def _restore_started(self, ev: RestoreStarted, _wall: int | None) -> None:
        self.stage, self.phase = Stage.RESTORE, None
        self._mark(ev.minute, f"restore started ({ev.cause})")

    def saw_action(self, action: str) -> None:
        if action in HOST_CHANGING:
            self.host_changed = True

    def _action_requested(self, ev: ActionRequested, _wall: int | None) -> None:
        self.saw_action(ev.action)

    def _restoration(self, ev: RestorationRecorded, _wall: int | None) -> None:
        self.restoration = {"started_minute": ev.started_minute, "finished_minute": ev.finished_minute,
                            **ev.checks, "verified": ev.verified}
        self.restoration_failed = failed_checks(ev.checks)

    def _verdict(self, ev: VerdictReached, _wall: int | None) -> None:
        self.verdict = {"hypothesis": ev.hypothesis, "basis": ev.basis, "next_experiment": ev.next_experiment,
                        "findings": ev.findings}

    def _harness(self, ev: HarnessRehearsed, _wall: int | None) -> None:
        row = {"outcome": ev.outcome, "verdict": ev.verdict, "scenario": ev.scenario,
                        "log_head_seq": ev.log_head_seq, "log_head_hash": ev.log_head_hash, "forecast": ev.forecast,
                        "plan_sha256": ev.plan_sha256, "folder": ev.folder}
        # the seed scenario's rehearsal, or the one against the model fitted to an earlier window
        if ev.scenario.startswith("fitted to window "):
            self.harness_fitted = row
        else:
            self.harness = row

    def _fault_scheduled(self, ev: FaultScheduled, _wall: int | None) -> None:
        self.faults.append({"spec": ev.spec, "fired": None})

    def _faults_accounted(self, ev: FaultsAccounted, _wall: int | None) -> None:
        self.faults = [{"spec": f.get("spec"), "fired": bool(f.get("fired"))} for f in ev.faults if isinstance(f, dict)]

    def _preserved(self, ev: PreservedChecked, _wall: int | None) -> None:
        for path, d in ev.paths.items():
            row = self.preserved.setdefault(path, {"path": path, "sha256_before": None, "sha256_after": None,
                                                   "unchanged": None})
            if ev.when == "before":
                row["sha256_before"] = d.get("sha256")
            else:
                row["sha256_after"], row["unchanged"] = d.get("sha256"), d.get("unchanged")

    def _bounds_scaled(self, ev: BoundsScaled, _wall: int | None) -> None:
        self.scaled_bounds = list(ev.bounds)

    def _alarm(self, ev: Alarm, _wall: int | None) -> None:
        self.alarms.append({"kind": ev.kind, "detail": ev.detail})

    def _trace_order(self, ev: TraceOrderFrozen, _wall: int | None) -> None:
        self.trace_order = ev.order

    def _closed(self, ev: WindowClosed, _wall: int | None) -> None:
        self.stage, self.outcome = Stage.CLOSED, ev.outcome
        self._mark(ev.minute, f"window closed: {ev.outcome}")


RESTORE_CHECKS = ("incumbent_sha256_match", "containment", "monitoring_registered", "direct_preflight", "readmitted",
                  "routed_preflight", "identity_restored", "no_fault_during_restore", "within_reservation")


def failed_checks(checks: dict[str, Any]) -> list[str]:
    """The restoration checks that failed, in report order (None, not applicable, is no failure)."""
    return [k for k in RESTORE_CHECKS if checks.get(k) is False]

HOST_CHANGING = frozenset({"quiesce", "unload", "load", "set_trace"})

# each handler takes its own event type; the table is keyed by that type, so the call is sound
_HANDLERS: dict[type[Event], Callable[[WindowFold, Any, int | None], None]] = {
    ActionRequested: WindowFold._action_requested,
    WindowOpened: WindowFold._opened, TimeMarked: WindowFold._time_marked, PhaseStarted: WindowFold._phase_started,
    RequestMeasured: WindowFold.count_request, CellRecorded: WindowFold._cell, AbortDecided: WindowFold._abort,
    RestoreStarted: WindowFold._restore_started, RestorationRecorded: WindowFold._restoration,
    VerdictReached: WindowFold._verdict, Alarm: WindowFold._alarm, BoundsScaled: WindowFold._bounds_scaled,
    HarnessRehearsed: WindowFold._harness, PreservedChecked: WindowFold._preserved,
    FaultScheduled: WindowFold._fault_scheduled, FaultsAccounted: WindowFold._faults_accounted, TraceOrderFrozen: WindowFold._trace_order,
    WindowClosed: WindowFold._closed,
}
