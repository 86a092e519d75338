"""The window's state and the primitives its procedures share: the clock, cells, aborts.

`WindowCore` is what the experiment (`policies.takedown`, the methods) and the restore (`policies.restore`) are
given: the typed state of one window and the few operations that change it in the ways the contract
allows (a cell recorded once, an abort recorded with its minute, a fault during the restore said).
`WindowPolicy` (`policies.window`) adds the routing of inputs, the guards and the clock's deadlines on
top; nothing here starts or replaces a procedure, so the procedures never depend on the router.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flare_diag.events.schema import (
    NS_PER_MIN,
    NS_PER_S,
    AbortDecided,
    ActionDone,
    Alarm,
    PhaseStarted,
    TimeMarked,
    window_minute,
)
from flare_diag.events.stages import Stage, advance
from flare_diag.policies import guards, rules, steady
from flare_diag.policies.driver import Driver, Interrupt
from flare_diag.policies.plan import PhaseSpec, Plan
from flare_diag.policies.planner import Arm, Calibration, Estimator, work_from
from flare_diag.policies.restarts import RestartWatch
from flare_diag.policies.scaling import DRAIN_MIN_REAL_S, WATCH_LOST_MIN_REAL_S, effective_s
from flare_diag.policies.state import AbortRecord, Cell, Incumbent, Ledger, Running

if TYPE_CHECKING:
    from flare_diag.policies.method import Method

READS = frozenset({"scrape_metrics", "snapshot", "read_identity", "manager_state", "validate_fixtures", "preview",
                   "retain_recipe", "health"})
# what a restore may ask again after the daemon restarted without its answer: reads, and the restore's own
# preflight generations and guard evaluations, none of which changes the host
RE_ASKABLE = READS | {"preflight", "steady_state"}


class WindowCore(Driver):
    """One window's typed state and the operations its procedures may use to change it.

    The procedures (policies/takedown.py, phases.py, methods/, restore.py, drain.py) read its fields and change it only
    through these, never through an underscored name (tests/test_architecture.py holds that):
    `act` / `act_all` (ask the host and wait for the outcome), `request` (ask without waiting), `emit`
    (a decision), `minute` / `stop_ns` / `mark_t0` / `mark_stop` (the window clock), `record_cell` /
    `close_open_cells` (the ledger), `abort_inside` / `fail_inside` (abort from inside a procedure:
    they raise Interrupt), `restore_fault`, and one named operation for each thing the host's answers
    change (the last section: `fixtures_known`, `candidate_loaded_as`, `phase_running`, ...). No
    procedure assigns a field (tests/test_architecture.py holds that too).
    """

    def __init__(self) -> None:
        super().__init__()
        self.plan: Plan = None  # type: ignore[assignment]  # set by WindowOpened
        self.window_id = ""
        self.time_scale = 1.0  # the window clock's scale: above 1 only for a simulated site
        self.stage = Stage.IDLE  # moves only as state.TRANSITIONS allows
        self.t0: int | None = None
        self.ledger = Ledger()
        self.method: Method = None  # type: ignore[assignment]  # the plan's, set by WindowOpened
        self.arms: list[Arm] = []
        self.all_phases: list[PhaseSpec] = []
        self.phase_order: list[str] = []
        self.required: list[str] = []  # cells without which the window is `partial` (contract 4)
        self.comparable: dict[str, bool] = {}
        self.calibration: Calibration | None = None
        self.est: Estimator = None  # type: ignore[assignment]  # set once the fixtures are known
        self.phase_marks: dict[str, tuple[float | None, float | None]] = {}  # phase -> (start, estimated end)
        self.draining_after = False  # the current phase's requests all finished; its closing drain runs
        self.current: Running | None = None
        self.abort: AbortRecord | None = None
        self.restore_cause: str | None = None
        self.restore_started: float | None = None
        self.readmit_requested = False
        self.restore_end_ns: int | None = None  # the restore's budget runs out here
        self.incumbent: Incumbent | None = None
        self.snapshots: dict[str, dict[str, Any] | None] = {}
        self.quiesced = False
        self.quiesced_at_ns = 0  # window time the quiesce's answer came back
        self.candidate_loaded: str | None = None  # incarnation label loaded by the window
        self.candidate_id: str | None = None
        self.candidate_recipe = ""
        self.candidate_sha: str | None = None
        self.failed_incarnations: dict[str, str] = {}
        self.unverified_incarnations: dict[str, str] = {}
        self.ref_labels: dict[str, Any] | None = None
        self.last_counters: dict[str, Any] | None = None
        self.fixtures: dict[str, dict[str, Any]] = {}
        self.stop_marked = False
        self.overrun_marked = False
        self.overrun_projected = False
        self.trace_stopped: str | None = None  # why the frozen trace order ended early
        self.baseline = guards.Baseline()  # growth relative to the loaded incarnation's first observation
        self.watch_last: dict[str, int] = {}  # source -> window time of its latest answer
        self.watch_failure: dict[str, str] = {}  # source -> its latest failure
        self.rules_disabled: set[str] = set()  # what the GPU watch said it cannot watch, once each
        self.took_down = False  # the quiesce was requested: from here on the host may be changed
        self.expected_incumbent = ""  # the sha256 an earlier window that did not restore left as the incumbent
        self.restore_faults: list[str] = []  # Xid, OOM or containment breaches seen during the restore
        self.xids_known = 0  # Xid events in the GPU view the window has already judged
        self.verified_identity: dict[str, dict[str, Any]] = {}  # incarnation label -> the identity its identity phase verified
        self.incumbent_back = False  # the restore has the incumbent loaded again (or never took it down)
        self.restore_resident: float | None = None  # the restored incumbent's resident memory when first seen
        self.current_since_ns = 0  # window time the running phase began
        self.drifted = False  # an identity read inside a phase differed: the open cell's identity did not hold
        self.drain_unseen: set[str] = set()  # drain gauges the current phase's drains could not see
        self.steady_state = False  # the plan's guards are evaluated on the site's Prometheus (WindowOpened)
        self.reuse_identity: list[str] = []  # counters whose C1 deltas must sum to cached_tokens (WindowOpened)
        self.guard_runs = steady.Tally()  # each guard's consecutive breaches, and what a dry run has said
        self.restart_watch = RestartWatch()  # the loaded incarnation's last counters: they never go back
        self.restore_restarts = 0  # unseen engine restarts the restore met: each one starts it over
        self.refused_run: list[Any] = []  # the latest consecutive requests the host refused (RequestDone)
        self.restore_unloaded = False  # the restore has the window's candidate unloaded: every bound holds again
        self.read_args: dict[int, dict[str, Any]] = {}  # outstanding re-askable actions -> their arguments
        # (incarnation label, body sha256) -> the prompt tokens the engine first counted for it, where (phase, #)
        self.prompt_seen: dict[tuple[str, str], tuple[int, str, int]] = {}
        self.reasked: dict[int, int] = {}  # a read asked again after a restart -> the id the restore waits on

    @property
    def closed(self) -> bool:
        return self.stage == Stage.CLOSED

    @property
    def cells(self) -> dict[str, dict[str, Any]]:
        return self.ledger.as_builtins()

    # --- time ----------------------------------------------------------------------------------

    def _deadline_s(self, action: str) -> float | None:
        t = self.plan.timing
        if action in ("load", "unload"):
            limit = t.load_timeout_s
        elif action in ("send_request", "preflight"):
            limit = t.request_timeout_s
        else:
            limit = t.action_timeout_s
        if self.restore_end_ns is not None:  # the restore's own budget bounds every action in it
            limit = min(limit, max(0.001, (self.restore_end_ns - self.now) / NS_PER_S))
        return limit

    def minute(self, ns: int | None = None) -> float | None:
        return window_minute(self.now if ns is None else ns, self.t0)

    def stop_ns(self) -> int:
        return self.t0 + int(self.plan.timing.stop_min * NS_PER_MIN)  # type: ignore[operator]  # t0 is set by the quiesce, before any stop-minute check

    def _closing_drain_end_ns(self) -> int:
        return self.stop_ns() + int(self.drain_timeout_s(self.plan.timing.drain_timeout_s) * NS_PER_S)

    def _watch_deadlines(self) -> dict[str, int]:
        """Each watch an abort rule depends on, and when its silence becomes `watch_lost`: the GPU
        watch (Xid, OOM, GPU memory) where the site has GPUs, the router watch (containment) where
        it has a router; counted from t0, when the window starts depending on them."""
        lost = int(self.watch_lost_s() * NS_PER_S)
        srcs = [s for s in ("gpu", "router") if self.snapshots.get(s) is not None]
        # a steady-state guard that can abort the experiment depends on Prometheus answering it with a number
        srcs += [f"guard:{g.name}" for g in self.enforced_guards("experiment")]
        return {s: max(self.watch_last.get(s, 0), self.t0 or 0) + lost for s in srcs}

    def enforced_guards(self, stage: str) -> list[steady.Guard]:
        """The guards that act (not dry runs) in `stage`, when the window has a Prometheus to ask."""
        if not self.steady_state or self.plan is None:
            return []
        return [g for g in self.plan.guards if not g.dry_run and steady.guards_stage(g, stage)]

    def watch_lost_s(self) -> float:
        """How long (window seconds) a watch may stay silent: the plan's bound, but never less than
        WATCH_LOST_MIN_REAL_S of real time. A scaled clock (a simulated site only) would otherwise
        shrink 30 window seconds to a fraction of a real second, which a loaded machine's poll can take."""
        return effective_s(self.plan.timing.watch_lost_s, WATCH_LOST_MIN_REAL_S, self.time_scale)

    def drain_timeout_s(self, planned: float) -> float:
        """How long (window seconds) a drain may take to settle: the plan's bound, but never less than
        DRAIN_MIN_REAL_S of real time. At x100, the plan's 10 s would leave a tenth of a real second for
        the consecutive scrapes the drain rule needs, which a loaded machine cannot promise."""
        return effective_s(planned, DRAIN_MIN_REAL_S, self.time_scale)

    def mark_t0(self) -> None:
        """The host is taken down (the quiesce answered): the window's minute 0, and its experiment begins."""
        self.t0 = self.now
        self.stage = advance(self.stage, Stage.EXPERIMENT)
        self.emit(TimeMarked(mark="t0", minute=0.0))

    def mark_stop(self) -> None:
        if not self.stop_marked:
            self.stop_marked = True
            self.emit(TimeMarked(mark="stop", minute=self.minute(self.stop_ns())))  # type: ignore[arg-type]  # after the quiesce: a minute, never None

    def request(self, action: str, args: dict[str, Any] | None = None, experimental: bool = False) -> int:
        if action in ("load", "unload"):  # a new incarnation's counters start at zero, legitimately
            self.restart_watch.reset()
        aid = super().request(action, args, experimental)
        if self.stage == Stage.RESTORE and action in RE_ASKABLE:
            self.read_args[aid] = dict(args or {})  # kept until answered: a restart may have to ask it again
        return aid

    # --- aborts and faults ---------------------------------------------------------------------

    def _record_abort(self, reason: str, detail: str) -> None:
        if not self.took_down and reason in rules.HOST_FAULTS:
            reason, detail = "preflight", f"{reason}: {detail} (before anything was taken down)"
        self.abort = AbortRecord(reason, detail, self.minute())
        self.emit(AbortDecided(reason=reason, detail=detail, minute=self.minute()))

    def abort_inside(self, reason: str, detail: str) -> None:
        self._record_abort(reason, detail)
        raise Interrupt("abort")

    def fail_inside(self, res: ActionDone, what: str) -> None:
        """A failed action before anything was changed: abort with its class, else as a preflight failure."""
        self.abort_inside(rules.abort_for_error(res.error) or "preflight", f"{what}: {res.detail or res.error}")

    def restore_fault(self, what: str) -> None:
        """A fault during the restore: the primary is not readmitted (if it is not yet), and it is said once."""
        if what in self.restore_faults:
            return
        self.restore_faults.append(what)
        self.emit(Alarm(kind="fault_during_restore", detail=what + ("" if not self.readmit_requested else
                                                                     " (after the primary's readmit was sent)")))

    # --- cells -------------------------------------------------------------------------------

    def record_cell(self, phase: str, status: str, reason: str, **kw: Any) -> None:
        started, est_end = self.phase_marks.get(phase, (None, None))
        cell = Cell(phase=phase, status=status, reason=reason, started_minute=started, estimated_end_minute=est_end,
                    ended_minute=self.minute() if started is not None else None, **kw)
        if self.ledger.add(cell):
            self.emit(cell)

    def close_open_cells(self, cause: str) -> None:
        if self.current is not None:
            c = self.current
            why = (f"cut at the stop minute after {c.done} of {c.total} requests" if cause == "stop_minute"
                   else f"the engine restarted during this phase, after {c.done} of {c.total} requests ({self.abort.detail})"
                   if self.abort and self.abort.reason == "engine_restart"
                   else f"window aborted ({self.abort.reason if self.abort else cause}) after {c.done} of {c.total} requests")
            drifted = self.drifted or bool(self.abort and self.abort.reason == "identity_drift")
            self.record_cell(c.id, "invalid", why, requests=c.done, comparable=c.comparable, incarnation_id=self.candidate_id,
                       identity_held=False if drifted else None)
            self.current = None
        if cause == "completed":
            why = "not started"
        elif cause == "stop_minute":
            why = "not started: the stop minute was reached"
        else:
            why = f"not started: window aborted ({self.abort.reason if self.abort else cause})"
        conditional = {c.id: c.admission for c in self.plan.conditional} if self.plan else {}
        for pid in self.phase_order:
            if pid in conditional:
                self.record_cell(pid, "deferred", f"later conditional stage, {conditional[pid]}", comparable=False)
            elif pid not in self.ledger:
                # contract 4 (amended 2026-12-03): `deferred` only for what time or the plan's order left
                # out; a cell an abort left unmeasured is `failed`, the abort named, optional or required
                # (issue 53: an optional cell read `deferred` after an abort, as if time had run out)
                aborted = cause not in ("completed", "stop_minute")
                said = why if pid not in self.phase_marks else _cut_inside(why)  # it had started: never "not started"
                self.record_cell(pid, "failed" if aborted else "deferred", said, comparable=self.comparable.get(pid, True))

    # --- what the host said: each changes the state in one named way ------------------------------

    def fixtures_known(self, fixtures: dict[str, dict[str, Any]]) -> None:
        """The fixtures' manifests are validated: the schedule's estimate starts from their work."""
        self.fixtures = fixtures
        self.est = Estimator(self.plan, work_from(self.plan, fixtures), self.calibration)

    def snapshot_taken(self, source: str, data: dict[str, Any] | None) -> None:
        """A preflight snapshot (None: the site has no such thing to snapshot)."""
        self.snapshots[source] = data

    def incumbent_found(self) -> None:
        """The incumbent is what the manager has loaded now; the Xids already in the GPU view are not the window's."""
        inc = self.snapshots.get("incumbent") or {}
        self.xids_known = len((self.snapshots.get("gpu") or {}).get("xid_events") or [])
        self.incumbent = Incumbent(recipe=inc.get("recipe"), sha256=inc.get("sha256"), identity=inc.get("identity", {}))

    def candidate_kept(self, sha256: str) -> None:
        """The candidate's exact bytes are retained: every load of it names this hash."""
        self.candidate_sha = sha256

    def taking_down(self) -> None:
        """The quiesce is asked for: from here on the host may be changed (its reply may be lost)."""
        self.took_down = True

    def quiesced_now(self) -> None:
        """The quiesce answered: the window's minute 0."""
        self.quiesced = True
        self.quiesced_at_ns = self.now
        self.mark_t0()

    def xids_judged(self, n: int) -> None:
        """`n` more Xid events of the GPU view have been judged."""
        self.xids_known += n

    def incarnation_failed(self, label: str, why: str) -> None:
        self.failed_incarnations[label] = why

    def candidate_unloaded(self) -> None:
        """No candidate is loaded: nothing verified about the last one holds, and growth starts over."""
        self.candidate_loaded = None
        self.ref_labels = None
        self.baseline.reset()

    def candidate_loaded_as(self, label: str, incarnation: str | None) -> None:
        self.candidate_loaded = label
        self.candidate_id = incarnation

    def phase_started(self, phase: str, end_ns: int) -> None:
        """A phase begins now and is estimated to end at `end_ns`."""
        self.emit(PhaseStarted(phase=phase, minute=self.minute(), estimated_end_minute=self.minute(end_ns)))  # type: ignore[arg-type]  # a phase starts after the quiesce: a minute, never None
        self.phase_marks[phase] = (self.minute(), self.minute(end_ns))

    def overrun_projection(self, late: bool) -> None:
        """Whether the required cells' projected end passes the stop minute (said once each time it starts to)."""
        self.overrun_projected = late

    def identity_verified(self, incarnation: str, identity: dict[str, Any]) -> None:
        """What every later read of this incarnation's identity is held to, phase by phase (the trace switch
        too, where the engine reports one: contract 4 holds every field of the identity)."""
        self.ref_labels = {k: identity.get(k) for k in ("image", "flare_commit", "package", "model", "incarnation", "recipe_sha256")}
        self.verified_identity[incarnation] = {k: v for k, v in identity.items() if k != "trace_enabled" or v is not None}

    def incarnation_unverified(self, incarnation: str, why: str) -> None:
        self.unverified_incarnations[incarnation] = why

    def trace_switched(self, incarnation: str, on: bool | None) -> None:
        """From here on the phase's reads are held to the trace switch as set."""
        verified = self.verified_identity.get(incarnation)
        if verified is not None and "trace_enabled" in verified:
            verified["trace_enabled"] = on

    def identity_drifted(self) -> None:
        """An identity read inside a phase differed: the open cell's identity did not hold."""
        self.drifted = True

    def phase_running(self, running: Running) -> None:
        """A phase's requests are about to be sent (its opening drain first)."""
        self.drain_unseen = set()
        self.current_since_ns = self.now
        self.current = running

    def phase_stopped(self) -> None:
        """No phase's requests are being sent."""
        self.current = None

    def phase_closing(self, closing: bool) -> None:
        """Whether the running phase's last requests have finished: what follows (its reads, its closing drain)
        is then judged as the closing of a finished phase, even across the stop minute."""
        self.draining_after = closing

    def requests_done(self, k: int) -> None:
        """`k` of the running phase's requests are answered."""
        if self.current is not None:
            self.current.done = k

    def prompt_counted(self, incarnation: str, body_sha256: str, seen: tuple[int, str, int]) -> tuple[int, str, int]:
        """What the engine first counted for an exact body on an incarnation: (prompt tokens, phase, #)."""
        return self.prompt_seen.setdefault((incarnation, body_sha256), seen)

    def drain_gauges_unseen(self, gauges: list[str]) -> None:
        self.drain_unseen.update(gauges)

    def counters_drained(self, counters: dict[str, Any]) -> None:
        """The counters a settled drain saw: what the next phase's deltas start from."""
        self.last_counters = counters

    def trace_order_stopped(self, why: str) -> None:
        self.trace_stopped = why

    def restore_unloaded_candidate(self) -> None:
        """From here on the GPUs and the engine are the incumbent's to answer for."""
        self.restore_unloaded = True

    def incumbent_returned(self) -> None:
        """The restore has the incumbent loaded again (a window that took nothing down has nothing of its own
        to judge)."""
        self.incumbent_back = self.took_down

    def incumbent_first_seen(self, resident_bytes: float | None) -> None:
        """The restored incumbent's first resident memory: what it may grow from."""
        self.restore_resident = resident_bytes

    def readmit_sent(self) -> None:
        """From here on an admitted backend is the readmission itself, not a breach."""
        self.readmit_requested = True


def _cut_inside(why: str) -> str:
    """What a phase that had started (an identity phase, or a replay phase before its requests) but has no cell
    says of the abort or the stop minute that cut it: "not started: X" becomes "X, during this phase"."""
    return why.removeprefix("not started: ") + ", during this phase"
