"""What changes a window's state: typed facts, and `evolve(state, fact) -> state`, pure, one rule a fact.

The decider (`policies.core`, `policies.window`) judges each input against the state it holds and, for every
change that input makes, hands one fact to `evolve`; the state it holds next is what `evolve` returns. A fact
carries what the decider was told or decided (an answer's figures, a cell, a window time), never a clock
of its own: the same facts fold to the same state (tests/test_evolve.py). A fact with no rule, and a stage
move events/stages.TRANSITIONS forbids, are refused (raised): either is a bug in the decider that asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from msgspec.structs import replace

from flare_diag.events.schema import ActionDone, RequestDone
from flare_diag.events.stages import Stage, advance
from flare_diag.policies.guards import Baseline
from flare_diag.policies.plan import Growth
from flare_diag.policies.planner import Learned
from flare_diag.policies.restarts import RestartWatch
from flare_diag.policies.state import AbortRecord, Asked, Cell, Incumbent, Running, Wait, WindowState
from flare_diag.policies.steady import Guard


class Fact(msgspec.Struct, frozen=True):
    """One change to a window's state."""


# --- the stages and the clock ---------------------------------------------------------------------

class Opened(Fact, frozen=True):
    """The window's plan is read: its opening (preflight, snapshots, the fixture check) begins."""


class ClockAdvanced(Fact, frozen=True):
    """An input carried this window time: the clock is the latest (it never goes back)."""
    at_ns: int


class ClockStarted(Fact, frozen=True):
    """The host is taken down: the window's minute 0, and its experiment begins."""
    at_ns: int


class StopMarked(Fact, frozen=True):
    """The stop minute is reached (said once)."""


class RestoreBegun(Fact, frozen=True):
    cause: str
    started_minute: float | None
    end_ns: int  # the restore's budget runs out here


class RestoreOverran(Fact, frozen=True):
    """The restore is still running at the window's end (said once)."""


class Closed(Fact, frozen=True):
    """The restore ended: the window's decisions are all made."""


# --- the procedure: what it asked, what was answered, what it waits for ----------------------------

class ActionAsked(Fact, frozen=True):
    action_id: int
    asked: Asked


class ActionAnswered(Fact, frozen=True):
    """An outstanding action's answer: kept for the procedure under the id it waits on."""
    action_id: int
    answer: ActionDone | RequestDone


class ActionDropped(Fact, frozen=True):
    """An outstanding action's answer will never come (a restart lost it, and it is asked again)."""
    action_id: int


class AnswersTaken(Fact, frozen=True):
    """The procedure has these answers: it goes on with them."""
    ids: tuple[int, ...]


class ProcedureWaits(Fact, frozen=True):
    """What the running procedure waits for next (None: it ended, or none runs)."""
    on: Wait | None


# --- aborts, cells, phases ------------------------------------------------------------------------

class Aborted(Fact, frozen=True):
    record: AbortRecord


class CellDecided(Fact, frozen=True):
    """A phase's cell; a phase that already has one keeps it."""
    cell: Cell


class PhaseMarked(Fact, frozen=True):
    """A phase began at minute `start`, estimated to end at minute `end`."""
    phase: str
    start: float | None
    end: float | None


class PhaseRunning(Fact, frozen=True):
    """A phase's requests are about to be sent (its opening drain first)."""
    running: Running
    at_ns: int


class RequestsDone(Fact, frozen=True):
    """`done` of the running phase's requests are answered."""
    done: int


class PhaseClosing(Fact, frozen=True):
    closing: bool


class PhaseStopped(Fact, frozen=True):
    """No phase's requests are being sent."""


class OverrunProjected(Fact, frozen=True):
    late: bool


class IdentityDrifted(Fact, frozen=True):
    """An identity read inside a phase differed: the open cell's identity did not hold."""


class DrainGaugesUnseen(Fact, frozen=True):
    gauges: tuple[str, ...]


class CountersDrained(Fact, frozen=True):
    counters: dict[str, Any]


class PromptCounted(Fact, frozen=True):
    """What the engine counted for an exact body on an incarnation; the first count is the one kept."""
    incarnation: str
    body_sha256: str
    seen: tuple[int, str, int]  # (prompt tokens, phase, #)


class AnswersSeen(Fact, frozen=True):
    """The completion ids a phase's answers named on an incarnation, each with the request first answered with
    it; an id already kept keeps its first request. One fact a phase, not one an answer: the map is copied once."""
    incarnation: str
    seen: dict[str, tuple[str, int]]  # completion id -> (phase, #)


class ScheduleLearned(Fact, frozen=True):
    """What the schedule's estimate knows after its start (the calibration) or a load or round the window timed."""
    learned: Learned


class TraceOrderStopped(Fact, frozen=True):
    why: str


# --- the host and its incarnations ----------------------------------------------------------------

class SnapshotTaken(Fact, frozen=True):
    source: str
    data: dict[str, Any] | None  # None: the site has no such thing to snapshot


class IncumbentFound(Fact, frozen=True):
    """The incumbent is what the manager's snapshot has loaded; the Xids already in the GPU's are not the window's."""


class FixturesKnown(Fact, frozen=True):
    fixtures: dict[str, dict[str, Any]]


class CandidateKept(Fact, frozen=True):
    sha256: str


class TakingDown(Fact, frozen=True):
    """The quiesce is asked for: from here on the host may be changed (its reply may be lost)."""


class QuiesceNotSent(Fact, frozen=True):
    """The quiesce was never carried out: the primary never left rotation."""


class Quiesced(Fact, frozen=True):
    at_ns: int


class CandidateUnloaded(Fact, frozen=True):
    """No candidate is loaded: nothing verified about the last one holds, and growth starts over."""


class CandidateLoaded(Fact, frozen=True):
    label: str
    incarnation: str | None


class IncarnationFailed(Fact, frozen=True):
    label: str
    why: str
    unseen: str = ""  # the words of a load or unload that got no answer ("": the host answered)


class HostAtRest(Fact, frozen=True):
    """After a load or unload that got no answer, the manager showed nothing loaded and nothing running."""


class LoadsStopped(Fact, frozen=True):
    """No later arm loads the candidate: why."""
    why: str


class IdentityVerified(Fact, frozen=True):
    incarnation: str
    identity: dict[str, Any]


class IncarnationCold(Fact, frozen=True):
    """A fresh incarnation's counters are verified at zero and no request has reached it yet."""
    label: str


class ColdEnded(Fact, frozen=True):
    """The first requests have reached the cold incarnation: it is cold no longer."""


class IncarnationUnverified(Fact, frozen=True):
    incarnation: str
    why: str


class TraceSwitched(Fact, frozen=True):
    incarnation: str
    on: bool | None


class LoadAsked(Fact, frozen=True):
    """A load or unload is asked for: the next incarnation's counters start at zero, legitimately."""


class CountersScraped(Fact, frozen=True):
    """A scrape's counters and gauges: later scrapes of the same incarnation are held to them."""
    counters: dict[str, float | None]
    gauges: dict[str, float | None]
    incarnation: str | None


class GrowthObserved(Fact, frozen=True):
    gauges: dict[str, Any]
    in_flight: int
    growth: Growth


class RequestRefused(Fact, frozen=True):
    """The host refused a request for what it is: one more in the run of refusals."""
    request: RequestDone


class RequestAnswered(Fact, frozen=True):
    """A request was answered: the run of refusals ends."""


# --- the watches and guards -----------------------------------------------------------------------

class WatchAnswered(Fact, frozen=True):
    source: str
    at_ns: int


class WatchFailing(Fact, frozen=True):
    source: str
    why: str


class XidsJudged(Fact, frozen=True):
    n: int


class RuleDisabled(Fact, frozen=True):
    why: str


class GuardEvaluated(Fact, frozen=True):
    guard: Guard
    value: float | None


class GuardSaid(Fact, frozen=True):
    """A guard's dry run (or its alarm during the restore) has been said for its current run."""
    name: str
    dry_run: bool


# --- the restore ----------------------------------------------------------------------------------

class RestoreFaulted(Fact, frozen=True):
    """A fault during the restore; each is kept once."""
    what: str


class RestoreRestarted(Fact, frozen=True):
    """An unseen engine restart during the restore: it starts over."""


class RestoreUnloadedCandidate(Fact, frozen=True):
    """From here on the GPUs and the engine are the incumbent's to answer for."""


class IncumbentReturned(Fact, frozen=True):
    """The restore has the incumbent loaded again."""


class IncumbentFirstSeen(Fact, frozen=True):
    resident_bytes: float | None


class ReadmitSent(Fact, frozen=True):
    """From here on an admitted backend is the readmission itself, not a breach."""


# --- evolve -----------------------------------------------------------------------------------------

F = TypeVar("F", bound=Fact)
_RULES: dict[type[Fact], Callable[[WindowState, Any], WindowState]] = {}


def _rule(kind: type[F]) -> Callable[[Callable[[WindowState, F], WindowState]], Callable[[WindowState, F], WindowState]]:
    def register(fn: Callable[[WindowState, F], WindowState]) -> Callable[[WindowState, F], WindowState]:
        _RULES[kind] = fn
        return fn
    return register


class UnknownFact(TypeError):
    """A fact with no rule: a bug in the decider, raised rather than ignored."""


def evolve(state: WindowState, fact: Fact) -> WindowState:
    """The state after `fact`. Pure: `state` is left as it was; raises UnknownFact or StageError (a decider's bug)."""
    rule = _RULES.get(type(fact))
    if rule is None:
        raise UnknownFact(f"no rule for {type(fact).__name__}")
    return rule(state, fact)


def _set(**changes: Any) -> Callable[[WindowState, Fact], WindowState]:
    """A rule that sets fixed values."""
    return lambda s, _f: replace(s, **changes)


_RULES.update({
    Opened: lambda s, _f: replace(s, stage=advance(s.stage, Stage.OPENING)),
    StopMarked: _set(stop_marked=True),
    RestoreOverran: _set(overrun_marked=True),
    Closed: lambda s, _f: replace(s, stage=advance(s.stage, Stage.CLOSED)),
    PhaseStopped: _set(current=None),
    IdentityDrifted: _set(drifted=True),
    TakingDown: _set(took_down=True),
    QuiesceNotSent: _set(took_down=False),
    CandidateUnloaded: _set(candidate_loaded=None, ref_labels=None, baseline=Baseline(), cold=None),
    HostAtRest: _set(load_unseen="", candidate_loaded=None, ref_labels=None, baseline=Baseline(), cold=None),
    ColdEnded: _set(cold=None),
    LoadAsked: _set(restart_watch=RestartWatch()),
    RequestAnswered: _set(refused_run=()),
    RestoreRestarted: lambda s, _f: replace(s, restore_restarts=s.restore_restarts + 1),
    RestoreUnloadedCandidate: _set(restore_unloaded=True),
    IncumbentReturned: lambda s, _f: replace(s, incumbent_back=s.took_down),  # nothing taken down: nothing to judge
    ReadmitSent: _set(readmit_requested=True),
})


@_rule(ClockAdvanced)
def _clock_advanced(s: WindowState, f: ClockAdvanced) -> WindowState:
    return s if f.at_ns <= s.now_ns else replace(s, now_ns=f.at_ns)


@_rule(ActionAsked)
def _action_asked(s: WindowState, f: ActionAsked) -> WindowState:
    return replace(s, asked={**s.asked, f.action_id: f.asked}, next_action_id=max(s.next_action_id, f.action_id + 1))


@_rule(ActionAnswered)
def _action_answered(s: WindowState, f: ActionAnswered) -> WindowState:
    asked = s.asked.get(f.action_id)
    if asked is None:  # nobody waits for it (answered already, or never asked): it changes nothing
        return s
    return replace(s, asked=_without(s.asked, (f.action_id,)), answered={**s.answered, asked.for_id: f.answer})


@_rule(ActionDropped)
def _action_dropped(s: WindowState, f: ActionDropped) -> WindowState:
    return replace(s, asked=_without(s.asked, (f.action_id,)))


@_rule(AnswersTaken)
def _answers_taken(s: WindowState, f: AnswersTaken) -> WindowState:
    return replace(s, answered=_without(s.answered, f.ids))


@_rule(ScheduleLearned)
def _schedule_learned(s: WindowState, f: ScheduleLearned) -> WindowState:
    return replace(s, learned=f.learned)


@_rule(ProcedureWaits)
def _procedure_waits(s: WindowState, f: ProcedureWaits) -> WindowState:
    return replace(s, waits=f.on)


K = TypeVar("K")
V = TypeVar("V")


def _without(d: dict[K, V], keys: tuple[K, ...]) -> dict[K, V]:
    return {k: v for k, v in d.items() if k not in keys}


@_rule(ClockStarted)
def _clock_started(s: WindowState, f: ClockStarted) -> WindowState:
    return replace(s, t0=f.at_ns, stage=advance(s.stage, Stage.EXPERIMENT))


@_rule(RestoreBegun)
def _restore_begun(s: WindowState, f: RestoreBegun) -> WindowState:
    return replace(s, stage=advance(s.stage, Stage.RESTORE), restore_cause=f.cause, restore_started=f.started_minute,
                   restore_end_ns=f.end_ns)


@_rule(Aborted)
def _aborted(s: WindowState, f: Aborted) -> WindowState:
    return replace(s, abort=f.record)


@_rule(CellDecided)
def _cell_decided(s: WindowState, f: CellDecided) -> WindowState:
    if f.cell.phase in s.cells:
        return s
    return replace(s, cells={**s.cells, f.cell.phase: f.cell})


@_rule(PhaseMarked)
def _phase_marked(s: WindowState, f: PhaseMarked) -> WindowState:
    return replace(s, phase_marks={**s.phase_marks, f.phase: (f.start, f.end)})


@_rule(PhaseRunning)
def _phase_running(s: WindowState, f: PhaseRunning) -> WindowState:
    return replace(s, drain_unseen=frozenset(), current_since_ns=f.at_ns, current=f.running)


@_rule(RequestsDone)
def _requests_done(s: WindowState, f: RequestsDone) -> WindowState:
    return s if s.current is None else replace(s, current=replace(s.current, done=f.done))


@_rule(PhaseClosing)
def _phase_closing(s: WindowState, f: PhaseClosing) -> WindowState:
    return replace(s, draining_after=f.closing)


@_rule(OverrunProjected)
def _overrun_projected(s: WindowState, f: OverrunProjected) -> WindowState:
    return replace(s, overrun_projected=f.late)


@_rule(DrainGaugesUnseen)
def _drain_gauges_unseen(s: WindowState, f: DrainGaugesUnseen) -> WindowState:
    return replace(s, drain_unseen=s.drain_unseen | set(f.gauges))


@_rule(CountersDrained)
def _counters_drained(s: WindowState, f: CountersDrained) -> WindowState:
    return replace(s, last_counters=f.counters)


@_rule(PromptCounted)
def _prompt_counted(s: WindowState, f: PromptCounted) -> WindowState:
    key = (f.incarnation, f.body_sha256)
    return s if key in s.prompt_seen else replace(s, prompt_seen={**s.prompt_seen, key: f.seen})


@_rule(AnswersSeen)
def _answers_seen(s: WindowState, f: AnswersSeen) -> WindowState:
    new = {(f.incarnation, a): where for a, where in f.seen.items() if (f.incarnation, a) not in s.answers_seen}
    return replace(s, answers_seen={**s.answers_seen, **new}) if new else s


@_rule(TraceOrderStopped)
def _trace_order_stopped(s: WindowState, f: TraceOrderStopped) -> WindowState:
    return replace(s, trace_stopped=f.why)


@_rule(SnapshotTaken)
def _snapshot_taken(s: WindowState, f: SnapshotTaken) -> WindowState:
    return replace(s, snapshots={**s.snapshots, f.source: f.data})


@_rule(IncumbentFound)
def _incumbent_found(s: WindowState, _f: IncumbentFound) -> WindowState:
    inc = s.snapshots.get("incumbent") or {}
    return replace(s, xids_known=len((s.snapshots.get("gpu") or {}).get("xid_events") or []),
                   incumbent=Incumbent(recipe=inc.get("recipe"), sha256=inc.get("sha256"), identity=inc.get("identity", {})))


@_rule(FixturesKnown)
def _fixtures_known(s: WindowState, f: FixturesKnown) -> WindowState:
    return replace(s, fixtures=f.fixtures)


@_rule(CandidateKept)
def _candidate_kept(s: WindowState, f: CandidateKept) -> WindowState:
    return replace(s, candidate_sha=f.sha256)


@_rule(Quiesced)
def _quiesced(s: WindowState, f: Quiesced) -> WindowState:
    return replace(s, quiesced=True, quiesced_at_ns=f.at_ns)


@_rule(CandidateLoaded)
def _candidate_loaded(s: WindowState, f: CandidateLoaded) -> WindowState:
    return replace(s, candidate_loaded=f.label, candidate_id=f.incarnation, cold=None)


@_rule(IncarnationCold)
def _incarnation_cold(s: WindowState, f: IncarnationCold) -> WindowState:
    return replace(s, cold=f.label)


@_rule(IncarnationFailed)
def _incarnation_failed(s: WindowState, f: IncarnationFailed) -> WindowState:
    return replace(s, failed_incarnations={**s.failed_incarnations, f.label: f.why}, load_unseen=f.unseen or s.load_unseen)


@_rule(LoadsStopped)
def _loads_stopped(s: WindowState, f: LoadsStopped) -> WindowState:
    return replace(s, loads_stopped=s.loads_stopped or f.why)


_REF_FIELDS = ("image", "flare_commit", "package", "model", "incarnation", "recipe_sha256")


@_rule(IdentityVerified)
def _identity_verified(s: WindowState, f: IdentityVerified) -> WindowState:
    # what every later read of this incarnation is held to: the trace switch only where the engine reports one
    held = {k: v for k, v in f.identity.items() if k != "trace_enabled" or v is not None}
    return replace(s, ref_labels={k: f.identity.get(k) for k in _REF_FIELDS},
                   verified_identity={**s.verified_identity, f.incarnation: held})


@_rule(IncarnationUnverified)
def _incarnation_unverified(s: WindowState, f: IncarnationUnverified) -> WindowState:
    return replace(s, unverified_incarnations={**s.unverified_incarnations, f.incarnation: f.why})


@_rule(TraceSwitched)
def _trace_switched(s: WindowState, f: TraceSwitched) -> WindowState:
    verified = s.verified_identity.get(f.incarnation)
    if verified is None or "trace_enabled" not in verified:
        return s
    return replace(s, verified_identity={**s.verified_identity, f.incarnation: {**verified, "trace_enabled": f.on}})


@_rule(CountersScraped)
def _counters_scraped(s: WindowState, f: CountersScraped) -> WindowState:
    return replace(s, restart_watch=s.restart_watch.observed(f.counters, f.gauges, f.incarnation))


@_rule(GrowthObserved)
def _growth_observed(s: WindowState, f: GrowthObserved) -> WindowState:
    return replace(s, baseline=s.baseline.check(f.gauges, f.in_flight, f.growth)[0])


@_rule(RequestRefused)
def _request_refused(s: WindowState, f: RequestRefused) -> WindowState:
    return replace(s, refused_run=(*s.refused_run, f.request))


@_rule(WatchAnswered)
def _watch_answered(s: WindowState, f: WatchAnswered) -> WindowState:
    return replace(s, watch_last={**s.watch_last, f.source: f.at_ns})


@_rule(WatchFailing)
def _watch_failing(s: WindowState, f: WatchFailing) -> WindowState:
    return replace(s, watch_failure={**s.watch_failure, f.source: f.why})


@_rule(XidsJudged)
def _xids_judged(s: WindowState, f: XidsJudged) -> WindowState:
    return replace(s, xids_known=s.xids_known + f.n)


@_rule(RuleDisabled)
def _rule_disabled(s: WindowState, f: RuleDisabled) -> WindowState:
    return replace(s, rules_disabled=s.rules_disabled | {f.why})


@_rule(GuardEvaluated)
def _guard_evaluated(s: WindowState, f: GuardEvaluated) -> WindowState:
    return replace(s, guard_runs=s.guard_runs.observe(f.guard, f.value)[0])


@_rule(GuardSaid)
def _guard_said(s: WindowState, f: GuardSaid) -> WindowState:
    return replace(s, guard_runs=s.guard_runs.said(f.name, f.dry_run))


@_rule(RestoreFaulted)
def _restore_faulted(s: WindowState, f: RestoreFaulted) -> WindowState:
    return s if f.what in s.restore_faults else replace(s, restore_faults=(*s.restore_faults, f.what))


@_rule(IncumbentFirstSeen)
def _incumbent_first_seen(s: WindowState, f: IncumbentFirstSeen) -> WindowState:
    return replace(s, restore_resident=f.resident_bytes)


FACTS: tuple[type[Fact], ...] = tuple(_RULES)  # every fact `evolve` has a rule for (the tests draw from these)
