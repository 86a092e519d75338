"""The window's typed state: the cells ledger, the abort, the incumbent and the phase being run."""

from __future__ import annotations

from typing import Any

import msgspec

from flare_diag.events.schema import CellRecorded

# One phase's result (contract section 4) with where it sat on the window's timeline: the ledger
# holds exactly the event that records it.
Cell = CellRecorded


class AbortRecord(msgspec.Struct):
    reason: str
    detail: str
    minute: float | None


class Incumbent(msgspec.Struct):
    """What the manager had loaded when the window started: what the restore brings back."""

    recipe: str | None
    sha256: str | None
    identity: dict[str, Any] = {}


class Running(msgspec.Struct):
    """The phase whose requests are being sent."""

    id: str
    total: int
    comparable: bool
    started_minute: float | None
    estimated_end_minute: float | None
    done: int = 0


class Ledger:
    """The cells decided so far, first decision wins."""

    def __init__(self) -> None:
        self.cells: dict[str, Cell] = {}

    def __contains__(self, phase: str) -> bool:
        return phase in self.cells

    def status(self, phase: str) -> str | None:
        c = self.cells.get(phase)
        return c.status if c else None

    def add(self, cell: Cell) -> bool:
        if cell.phase in self.cells:
            return False
        self.cells[cell.phase] = cell
        return True

    def as_builtins(self) -> dict[str, dict[str, Any]]:
        return {p: msgspec.to_builtins(c) for p, c in self.cells.items()}


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
