"""The window's state and the primitives its procedures share: the clock, cells, aborts.

`WindowCore` is what the experiment (`policies.takedown`, the methods) and the restore (`policies.restore`) are
given: one window's state (`state`, a frozen `WindowState` that only `apply(fact)` replaces, through the pure
`policies.evolve.evolve`) and the few operations that change it in the ways the contract allows (a cell recorded once, an abort recorded with its minute, a fault during the restore said).
`WindowPolicy` (`policies.window`) adds the routing of inputs, the guards and the clock's deadlines on
top; nothing here starts or replaces a procedure, so the procedures never depend on the router.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

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
from flare_diag.events.stages import Stage
from flare_diag.policies import rules, steady
from flare_diag.policies.driver import Driver, Interrupt
from flare_diag.policies.plan import PhaseSpec, Plan
from flare_diag.policies.planner import Arm, Calibration, Estimator, Learned, work_from
from flare_diag.policies.scaling import DRAIN_MIN_REAL_S, WATCH_LOST_MIN_REAL_S, effective_s
from flare_diag.policies.evolve import (
    Aborted,
    AnswersSeen,
    CandidateKept,
    CandidateLoaded,
    CandidateUnloaded,
    HostAtRest,
    LoadsStopped,
    CellDecided,
    ClockStarted,
    ColdEnded,
    CountersDrained,
    DrainGaugesUnseen,
    Fact,
    FixturesKnown,
    IdentityDrifted,
    IdentityVerified,
    IncarnationCold,
    IncarnationFailed,
    IncarnationUnverified,
    IncumbentFirstSeen,
    IncumbentFound,
    IncumbentReturned,
    LoadAsked,
    OverrunProjected,
    PhaseClosing,
    PhaseMarked,
    PhaseRunning,
    PhaseStopped,
    PromptCounted,
    Quiesced,
    ReadmitSent,
    RequestsDone,
    RestoreFaulted,
    RestoreUnloadedCandidate,
    ScheduleLearned,
    SnapshotTaken,
    StopMarked,
    TakingDown,
    TraceOrderStopped,
    TraceSwitched,
    XidsJudged,
    evolve,
)
from flare_diag.policies.state import AbortRecord, Cell, Running, WindowState

if TYPE_CHECKING:
    from flare_diag.policies.method import Method

READS = frozenset({"scrape_metrics", "snapshot", "read_identity", "manager_state", "validate_fixtures", "preview",
                   "retain_recipe", "health"})
# what a restore may ask again after the daemon restarted without its answer: reads, and the restore's own
# preflight generations and guard evaluations, none of which changes the host
RE_ASKABLE = READS | {"preflight", "steady_state"}


class WindowCore(Driver):
    """One window's typed state and the operations its procedures may use to change it.

    The procedures (policies/takedown.py, phases.py, methods/, restore.py, drain.py) read `w.state` and change it only
    through these, never through an underscored name (tests/test_architecture.py holds that):
    `act` / `act_all` (ask the host and wait for the outcome), `request` (ask without waiting), `emit`
    (a decision), `minute` / `stop_ns` / `mark_t0` / `mark_stop` (the window clock), `record_cell` /
    `close_open_cells` (the ledger), `abort_inside` / `fail_inside` (abort from inside a procedure:
    they raise Interrupt), `restore_fault`, and one named operation for each thing the host's answers
    change (the last section: `fixtures_known`, `candidate_loaded_as`, `phase_running`, ...), each one fact
    for `evolve`. Nothing writes into the state (it is frozen, and tests/test_architecture.py finds no
    container in it changed); what `WindowState` leaves out, and why, its docstring says.
    """

    def __init__(self) -> None:
        super().__init__()
        self.state = WindowState()  # everything the window is told and decides: changed only by `evolve`
        self.plan: Plan = None  # type: ignore[assignment]  # set by WindowOpened
        self.window_id = ""
        self.time_scale = 1.0  # the window clock's scale: above 1 only for a simulated site
        self.method: Method = None  # type: ignore[assignment]  # the plan's, set by WindowOpened
        self.arms: list[Arm] = []
        self.all_phases: list[PhaseSpec] = []
        self.phase_order: list[str] = []
        self.required: list[str] = []  # cells without which the window is `partial` (contract 4)
        self.comparable: dict[str, bool] = {}
        self.calibration: Calibration | None = None
        self.est: Estimator = None  # type: ignore[assignment]  # set once the fixtures are known
        self.candidate_recipe = ""
        self.expected_incumbent = ""  # the sha256 an earlier window that did not restore left as the incumbent
        self.steady_state = False  # the plan's guards are evaluated on the site's Prometheus (WindowOpened)
        self.reuse_identity: list[str] = []  # counters whose C1 deltas must sum to cached_tokens (WindowOpened)
        self.startup = (0, 0)  # the engine's own start-up requests a fresh incarnation may show: (at most, tokens each)

    @property
    def closed(self) -> bool:
        return self.state.stage == Stage.CLOSED

    @property
    def cells(self) -> dict[str, dict[str, Any]]:
        return {p: msgspec.to_builtins(c) for p, c in self.state.cells.items()}

    def apply(self, fact: Fact) -> None:
        """The one way the window's state changes."""
        self.state = evolve(self.state, fact)

    # --- time ----------------------------------------------------------------------------------

    def _deadline_s(self, action: str) -> float | None:
        t = self.plan.timing
        if action in ("load", "unload"):
            limit = t.load_timeout_s
        elif action in ("send_request", "preflight"):
            limit = t.request_timeout_s
        else:
            limit = t.action_timeout_s
        if self.state.restore_end_ns is not None:  # the restore's own budget bounds every action in it
            limit = min(limit, max(0.001, (self.state.restore_end_ns - self.now) / NS_PER_S))
        return limit

    def minute(self, ns: int | None = None) -> float | None:
        return window_minute(self.now if ns is None else ns, self.state.t0)

    def stop_ns(self) -> int:
        return self.state.t0 + int(self.plan.timing.stop_min * NS_PER_MIN)  # type: ignore[operator]  # t0 is set by the quiesce, before any stop-minute check

    def _closing_drain_end_ns(self) -> int:
        return self.stop_ns() + int(self.drain_timeout_s(self.plan.timing.drain_timeout_s) * NS_PER_S)

    def _watch_deadlines(self) -> dict[str, int]:
        """Each watch an abort rule depends on, and when its silence becomes `watch_lost`: the GPU
        watch (Xid, OOM, GPU memory) where the site has GPUs, the router watch (containment) where
        it has a router; counted from t0, when the window starts depending on them."""
        lost = int(self.watch_lost_s() * NS_PER_S)
        srcs = [s for s in ("gpu", "router") if self.state.snapshots.get(s) is not None]
        # a steady-state guard that can abort the experiment depends on Prometheus answering it with a number
        srcs += [f"guard:{g.name}" for g in self.enforced_guards("experiment")]
        return {s: max(self.state.watch_last.get(s, 0), self.state.t0 or 0) + lost for s in srcs}

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
        self.apply(ClockStarted(at_ns=self.now))
        self.emit(TimeMarked(mark="t0", minute=0.0))

    def mark_stop(self) -> None:
        if not self.state.stop_marked:
            self.apply(StopMarked())
            self.emit(TimeMarked(mark="stop", minute=self.minute(self.stop_ns())))  # type: ignore[arg-type]  # after the quiesce: a minute, never None

    def request(self, action: str, args: dict[str, Any] | None = None, experimental: bool = False,
                for_id: int | None = None) -> int:
        if action in ("load", "unload"):  # a new incarnation's counters start at zero, legitimately
            self.apply(LoadAsked())
        return super().request(action, args, experimental, for_id)

    def _reaskable(self, action: str) -> bool:
        return self.state.stage == Stage.RESTORE and action in RE_ASKABLE

    # --- aborts and faults ---------------------------------------------------------------------

    def _record_abort(self, reason: str, detail: str) -> None:
        if not self.state.took_down and reason in rules.HOST_FAULTS:
            reason, detail = "preflight", f"{reason}: {detail} (before anything was taken down)"
        self.apply(Aborted(record=AbortRecord(reason, detail, self.minute())))
        self.emit(AbortDecided(reason=reason, detail=detail, minute=self.minute()))

    def abort_inside(self, reason: str, detail: str) -> None:
        self._record_abort(reason, detail)
        raise Interrupt("abort")

    def fail_inside(self, res: ActionDone, what: str) -> None:
        """A failed action before anything was changed: abort with its class, else as a preflight failure."""
        self.abort_inside(rules.abort_for_error(res.error) or "preflight", f"{what}: {res.detail or res.error}")

    def restore_fault(self, what: str) -> None:
        """A fault during the restore: the primary is not readmitted (if it is not yet), and it is said once."""
        if what in self.state.restore_faults:
            return
        self.apply(RestoreFaulted(what=what))
        self.emit(Alarm(kind="fault_during_restore", detail=what + ("" if not self.state.readmit_requested else
                                                                     " (after the primary's readmit was sent)")))

    # --- cells -------------------------------------------------------------------------------

    def record_cell(self, phase: str, status: str, reason: str, **kw: Any) -> None:
        started, est_end = self.state.phase_marks.get(phase, (None, None))
        cell = Cell(phase=phase, status=status, reason=reason, started_minute=started, estimated_end_minute=est_end,
                    ended_minute=self.minute() if started is not None else None, **kw)
        if phase not in self.state.cells:
            self.apply(CellDecided(cell=cell))
            self.emit(cell)

    def close_open_cells(self, cause: str) -> None:
        if self.state.current is not None:
            c = self.state.current
            why = (f"cut at the stop minute after {c.done} of {c.total} requests" if cause == "stop_minute"
                   else f"the engine restarted during this phase, after {c.done} of {c.total} requests ({self.state.abort.detail})"
                   if self.state.abort and self.state.abort.reason == "engine_restart"
                   else f"window aborted ({self.state.abort.reason if self.state.abort else cause}) after {c.done} of {c.total} requests")
            drifted = self.state.drifted or bool(self.state.abort and self.state.abort.reason == "identity_drift")
            self.record_cell(c.id, "invalid", why, requests=c.done, comparable=c.comparable, incarnation_id=self.state.candidate_id,
                       identity_held=False if drifted else None)
            self.apply(PhaseStopped())
        if cause == "completed":
            why = "not started"
        elif cause == "stop_minute":
            why = "not started: the stop minute was reached"
        else:
            why = f"not started: window aborted ({self.state.abort.reason if self.state.abort else cause})"
        conditional = {c.id: c.admission for c in self.plan.conditional} if self.plan else {}
        for pid in self.phase_order:
            if pid in conditional:
                self.record_cell(pid, "deferred", f"later conditional stage, {conditional[pid]}", comparable=False)
            elif pid not in self.state.cells:
                # contract 4 (amended 2026-12-03): `deferred` only for what time or the plan's order left
                # out; a cell an abort left unmeasured is `failed`, the abort named, optional or required
                # (issue 53: an optional cell read `deferred` after an abort, as if time had run out)
                aborted = cause not in ("completed", "stop_minute")
                said = why if pid not in self.state.phase_marks else _cut_inside(why)  # it had started: never "not started"
                self.record_cell(pid, "failed" if aborted else "deferred", said, comparable=self.comparable.get(pid, True))

    # --- what the host said: each changes the state in one named way, by one fact (policies/evolve.py says
    # what each fact changes) -------------------------------------------------------------------------

    def fixtures_known(self, fixtures: dict[str, dict[str, Any]]) -> None:
        """The fixtures' manifests are validated: the schedule's estimate starts from their work."""
        self.apply(FixturesKnown(fixtures=fixtures))
        self.est = Estimator(self.plan, work_from(self.plan, fixtures), self.calibration,
                             learned=lambda: self.state.learned, teach=self._schedule_learned)
        self.apply(ScheduleLearned(learned=self.est.start))

    def _schedule_learned(self, learned: Learned) -> None:
        self.apply(ScheduleLearned(learned=learned))

    def snapshot_taken(self, source: str, data: dict[str, Any] | None) -> None:
        """A preflight snapshot (None: the site has no such thing to snapshot)."""
        self.apply(SnapshotTaken(source=source, data=data))

    def incumbent_found(self) -> None:
        self.apply(IncumbentFound())

    def candidate_kept(self, sha256: str) -> None:
        """The candidate's exact bytes are retained: every load of it names this hash."""
        self.apply(CandidateKept(sha256=sha256))

    def taking_down(self) -> None:
        self.apply(TakingDown())

    def quiesced_now(self) -> None:
        """The quiesce answered: the window's minute 0."""
        self.apply(Quiesced(at_ns=self.now))
        self.mark_t0()

    def xids_judged(self, n: int) -> None:
        self.apply(XidsJudged(n=n))

    def incarnation_failed(self, label: str, why: str, unseen: str = "") -> None:
        """`label` did not load or unload (`why`); `unseen`: the words of one that got no answer."""
        self.apply(IncarnationFailed(label=label, why=why, unseen=unseen))

    def host_at_rest(self) -> None:
        """The manager shows nothing loaded and nothing running: the next candidate load may go."""
        self.apply(HostAtRest())

    def loads_stopped(self, why: str) -> None:
        self.apply(LoadsStopped(why=why))

    def candidate_unloaded(self) -> None:
        self.apply(CandidateUnloaded())

    def candidate_loaded_as(self, label: str, incarnation: str | None) -> None:
        self.apply(CandidateLoaded(label=label, incarnation=incarnation))

    def phase_started(self, phase: str, end_ns: int) -> None:
        """A phase begins now and is estimated to end at `end_ns`."""
        self.emit(PhaseStarted(phase=phase, minute=self.minute(), estimated_end_minute=self.minute(end_ns)))  # type: ignore[arg-type]  # a phase starts after the quiesce: a minute, never None
        self.apply(PhaseMarked(phase=phase, start=self.minute(), end=self.minute(end_ns)))

    def overrun_projection(self, late: bool) -> None:
        """Whether the required cells' projected end passes the stop minute (said once each time it starts to)."""
        self.apply(OverrunProjected(late=late))

    def identity_verified(self, incarnation: str, identity: dict[str, Any]) -> None:
        """What every later read of this incarnation's identity is held to, phase by phase (the trace switch
        too, where the engine reports one: contract 4 holds every field of the identity)."""
        self.apply(IdentityVerified(incarnation=incarnation, identity=identity))

    def incarnation_cold(self, incarnation: str) -> None:
        """A fresh incarnation verified at zero: its first request is held to finding nothing in the host cache."""
        self.apply(IncarnationCold(label=incarnation))

    def cold_ended(self) -> None:
        if self.state.cold is not None:
            self.apply(ColdEnded())

    def incarnation_unverified(self, incarnation: str, why: str) -> None:
        self.apply(IncarnationUnverified(incarnation=incarnation, why=why))

    def trace_switched(self, incarnation: str, on: bool | None) -> None:
        """From here on the phase's reads are held to the trace switch as set."""
        self.apply(TraceSwitched(incarnation=incarnation, on=on))

    def identity_drifted(self) -> None:
        self.apply(IdentityDrifted())

    def phase_running(self, running: Running) -> None:
        self.apply(PhaseRunning(running=running, at_ns=self.now))

    def phase_stopped(self) -> None:
        self.apply(PhaseStopped())

    def phase_closing(self, closing: bool) -> None:
        """Whether the running phase's last requests have finished: what follows (its reads, its closing drain)
        is then judged as the closing of a finished phase, even across the stop minute."""
        self.apply(PhaseClosing(closing=closing))

    def requests_done(self, k: int) -> None:
        self.apply(RequestsDone(done=k))

    def prompt_counted(self, incarnation: str, body_sha256: str, seen: tuple[int, str, int]) -> tuple[int, str, int]:
        """What the engine first counted for an exact body on an incarnation: (prompt tokens, phase, #)."""
        self.apply(PromptCounted(incarnation=incarnation, body_sha256=body_sha256, seen=seen))
        return self.state.prompt_seen[(incarnation, body_sha256)]

    def answers_seen(self, incarnation: str, seen: dict[str, tuple[str, int]]) -> None:
        """The completion ids a phase's answers named on an incarnation, each with its first request: (phase, #)."""
        self.apply(AnswersSeen(incarnation=incarnation, seen=seen))

    def drain_gauges_unseen(self, gauges: list[str]) -> None:
        self.apply(DrainGaugesUnseen(gauges=tuple(gauges)))

    def counters_drained(self, counters: dict[str, Any]) -> None:
        """The counters a settled drain saw: what the next phase's deltas start from."""
        self.apply(CountersDrained(counters=counters))

    def trace_order_stopped(self, why: str) -> None:
        self.apply(TraceOrderStopped(why=why))

    def restore_unloaded_candidate(self) -> None:
        self.apply(RestoreUnloadedCandidate())

    def incumbent_returned(self) -> None:
        self.apply(IncumbentReturned())

    def incumbent_first_seen(self, resident_bytes: float | None) -> None:
        self.apply(IncumbentFirstSeen(resident_bytes=resident_bytes))

    def readmit_sent(self) -> None:
        self.apply(ReadmitSent())


def _cut_inside(why: str) -> str:
    """What a phase that had started (an identity phase, or a replay phase before its requests) but has no cell
    says of the abort or the stop minute that cut it: "not started: X" becomes "X, during this phase"."""
    return why.removeprefix("not started: ") + ", during this phase"
