"""The window's typed state as one frozen value (`WindowState`, changed only by `policies.evolve`), and its parts."""

from __future__ import annotations

from typing import Any

import msgspec

from flare_diag.events.actions import AnyAction
from flare_diag.events.schema import ActionDone, CellRecorded, RequestDone
from flare_diag.events.stages import Stage
from flare_diag.policies.guards import Baseline
from flare_diag.policies.planner import Learned
from flare_diag.policies.restarts import RestartWatch
from flare_diag.policies.steady import Tally

# One phase's result (contract section 4) with where it sat on the window's timeline: the ledger
# holds exactly the event that records it.
Cell = CellRecorded


class AbortRecord(msgspec.Struct, frozen=True):
    reason: str
    detail: str
    minute: float | None


class Incumbent(msgspec.Struct, frozen=True):
    """What the manager had loaded when the window started: what the restore brings back."""

    recipe: str | None
    sha256: str | None
    identity: dict[str, Any] = {}


class Running(msgspec.Struct, frozen=True):
    """The phase whose requests are being sent."""

    id: str
    total: int
    comparable: bool
    started_minute: float | None
    estimated_end_minute: float | None
    done: int = 0


class Act(msgspec.Struct, frozen=True, tag=True):
    """The procedure waits for these actions' answers (all of them)."""

    ids: tuple[int, ...]


class Sleep(msgspec.Struct, frozen=True, tag=True):
    """The procedure waits for the window clock to reach `until_ns`."""

    until_ns: int


class Quiet(msgspec.Struct, frozen=True, tag=True):
    """The procedure waits until no action is outstanding."""


Wait = Act | Sleep | Quiet


class Asked(msgspec.Struct, frozen=True):
    """An action the decider asked for and has no answer to yet."""

    request: AnyAction
    experimental: bool
    for_id: int  # the id the procedure waits on: its own, or, for a read asked again after a restart, the first's
    reaskable: bool = False  # a read of the restore's, which a restart that lost its answer may ask again


class WindowState(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one window's decider has been told and has decided, as a value.

    The decider holds one of these and replaces it with `policies.evolve.evolve(state, fact)`; nothing
    assigns a field. Left out, and why: the plan and what the opening derived from it (set once, by
    `WindowOpened`; the estimator's arithmetic, `planner.Estimator`, whose lessons are `learned`), and the
    procedure's continuation (its generator: `policies.driver`, docs/departures.md), whose waits, actions
    outstanding and answers not yet taken are fields here. Minutes are the window's; `*_ns` fields are
    window time."""

    stage: Stage = Stage.IDLE  # moves only as events/stages.TRANSITIONS allows
    now_ns: int = 0  # the window clock: the latest input's time (it never goes back)
    next_action_id: int = 1
    asked: dict[int, Asked] = {}  # action id -> what was asked, until its answer comes
    answered: dict[int, ActionDone | RequestDone] = {}  # answers the procedure has not taken yet, by the id it waits on
    waits: Wait | None = None  # what the running procedure waits for (None: none runs, or it has not yielded)
    t0: int | None = None  # the take-down's window time: minute 0
    cells: dict[str, Cell] = {}  # the ledger: first decision wins
    phase_marks: dict[str, tuple[float | None, float | None]] = {}  # phase -> (start, estimated end)
    current: Running | None = None
    current_since_ns: int = 0  # window time the running phase began
    draining_after: bool = False  # the current phase's requests all finished; its closing drain runs
    drifted: bool = False  # an identity read inside a phase differed: the open cell's identity did not hold
    drain_unseen: frozenset[str] = frozenset()  # drain gauges the current phase's drains could not see
    abort: AbortRecord | None = None
    took_down: bool = False  # the quiesce was requested: from here on the host may be changed
    quiesced: bool = False
    quiesced_at_ns: int = 0  # window time the quiesce's answer came back
    incumbent: Incumbent | None = None
    snapshots: dict[str, dict[str, Any] | None] = {}
    fixtures: dict[str, dict[str, Any]] = {}
    candidate_sha: str | None = None
    candidate_loaded: str | None = None  # incarnation label loaded by the window
    candidate_id: str | None = None
    failed_incarnations: dict[str, str] = {}
    unverified_incarnations: dict[str, str] = {}
    load_unseen: str = ""  # a candidate load or unload that got no answer: the manager is asked before the next
    loads_stopped: str = ""  # why no later arm loads the candidate (the manager did not show a host at rest)
    verified_identity: dict[str, dict[str, Any]] = {}  # incarnation label -> the identity its identity phase verified
    cold: str | None = None  # an incarnation verified fresh (counters at zero) that no request has reached yet
    ref_labels: dict[str, Any] | None = None
    last_counters: dict[str, Any] | None = None  # the counters the last settled drain saw
    # (incarnation label, body sha256) -> the prompt tokens the engine first counted for it, where (phase, #)
    prompt_seen: dict[tuple[str, str], tuple[int, str, int]] = {}
    # (incarnation label, completion id) -> the request that was first answered with it, (phase, #)
    answers_seen: dict[tuple[str, str], tuple[str, int]] = {}
    stop_marked: bool = False
    overrun_marked: bool = False
    overrun_projected: bool = False
    trace_stopped: str | None = None  # why the frozen trace order ended early
    watch_last: dict[str, int] = {}  # source -> window time of its latest answer
    watch_failure: dict[str, str] = {}  # source -> its latest failure
    rules_disabled: frozenset[str] = frozenset()  # what the GPU watch said it cannot watch, once each
    xids_known: int = 0  # Xid events in the GPU view the window has already judged
    learned: Learned = Learned()  # what the schedule's estimate has learned (its calibration, then loads and rounds)
    baseline: Baseline = Baseline()  # growth relative to the loaded incarnation's first observation
    guard_runs: Tally = Tally()  # each guard's consecutive breaches, and what a dry run has said
    restart_watch: RestartWatch = RestartWatch()  # the loaded incarnation's last counters: they never go back
    refused_run: tuple[RequestDone, ...] = ()  # the latest consecutive requests the host refused
    restore_cause: str | None = None
    restore_started: float | None = None
    restore_end_ns: int | None = None  # the restore's budget runs out here
    restore_faults: tuple[str, ...] = ()  # Xid, OOM or containment breaches seen during the restore
    restore_restarts: int = 0  # unseen engine restarts the restore met: each one starts it over
    restore_unloaded: bool = False  # the restore has the window's candidate unloaded: every bound holds again
    incumbent_back: bool = False  # the restore has the incumbent loaded again (or never took it down)
    restore_resident: float | None = None  # the restored incumbent's resident memory when first seen
    readmit_requested: bool = False

    def status(self, phase: str) -> str | None:
        """The phase's cell status, or None while it has no cell."""
        c = self.cells.get(phase)
        return c.status if c else None


class Outstanding(msgspec.Struct, frozen=True):
    """An action the decider asked for and has no answer to yet."""

    action_id: int
    action: str
    experimental: bool


class Waiting(msgspec.Struct, frozen=True):
    """What the running procedure waits for before it goes on (one of the three)."""

    actions: tuple[int, ...] = ()  # these actions' answers
    until_minute: float | None = None  # the window clock to reach this minute
    quiet: bool = False  # no action outstanding


class Working(msgspec.Struct, frozen=True, kw_only=True):
    """The running figures behind the decider's judgements: the schedule's estimate, the growth baseline,
    the counters it holds later scrapes to."""

    pace: float | None  # the estimator's pace against the plan's rate model (None before the fixtures are known)
    overhead_s: float | None  # its fitted seconds a request beyond the rate model
    rounds: int  # request rounds it has learned from
    load_s: float | None  # what it expects a load to take
    resident_baseline_bytes: float | None  # the loaded incarnation's first resident memory (growth rule)
    growth_excess_runs: int  # consecutive observations over the growth bound
    drained_counters: dict[str, Any] | None  # the counters the last settled drain saw
    incarnation_counters: dict[str, float]  # the loaded incarnation's latest counters (never go back)
    process_start_time: float | None
    prompts_seen: int  # exact bodies whose prompt size the engine has counted, held to it later
    answers_seen: int = 0  # completion ids answers have named, each held to the request it first answered
    xids_known: int  # Xid events already judged


class WindowSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What one window's decider holds after an input, as a value: encodable, comparable, printable.

    Its stage, clock, cells, running phase, the steps its procedure is in and what it waits for,
    outstanding actions, abort, host, watches, restore and the running figures behind its judgements.
    Left out: the procedure's locals (a generator's, which replaying the log's inputs rebuilds:
    docs/departures.md), the host's answers it keeps whole (the preflight snapshots, the
    fixture manifests, each body's counted prompt size: the log holds them) and the plan. Minutes are
    the window's (None before the take-down's minute 0)."""

    window_id: str
    stage: str
    inputs: int  # inputs taken so far
    minute: float | None  # the window clock at the latest input
    stop_minute: float | None  # the plan's stop minute (None before the window opened)
    cells: dict[str, Cell]
    required: tuple[str, ...]
    running: Running | None
    waiting: Waiting | None  # None: no procedure is running (before the window opened, or closed)
    procedure: tuple[str, ...]  # the running procedure's chain of steps, outermost first (where, not its locals)
    outstanding: tuple[Outstanding, ...]
    abort: AbortRecord | None
    incumbent: Incumbent | None
    took_down: bool
    candidate_loaded: str | None
    candidate_id: str | None
    failed_incarnations: dict[str, str]
    unverified_incarnations: dict[str, str]
    verified_incarnations: tuple[str, ...]
    watch_answered_minute: dict[str, float | None]  # source -> the window minute of its latest answer
    watch_failure: dict[str, str]
    rules_disabled: tuple[str, ...]
    guard_runs: dict[str, int]  # guard -> its run of consecutive breaches
    stop_marked: bool
    overrun_marked: bool
    trace_stopped: str | None
    restore_cause: str | None
    restore_started_minute: float | None
    restore_end_minute: float | None  # the restore's budget runs out here
    restore_faults: tuple[str, ...]
    restore_restarts: int
    restore_unloaded: bool  # the restore has the window's candidate unloaded
    incumbent_back: bool
    readmit_requested: bool
    working: Working
    loads_stopped: str = ""  # why no later arm loads the candidate ("": later arms may)
