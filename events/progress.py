"""Live progress of a window (stage, phase, requests, minute, aborts) as a fold over its events."""

from __future__ import annotations

from events.base import Event
from events.report_md import failed_checks
from events.schema import (
    AbortDecided, Alarm, CellRecorded, Input, PhaseStarted, RequestMeasured, RestorationRecorded, RestoreStarted,
    TimeMarked, VerdictReached, WindowClosed, WindowOpened,
)

NS_PER_MIN = 60_000_000_000


class WindowProgress:
    """What `status` and `watch` show; `apply` each of the window's events in seq order."""

    def __init__(self, window_id: str = "") -> None:
        self.window_id = window_id
        self.plan = ""
        self.rehearsal = False
        self.stop_min: float | None = None
        self.window_min: float | None = None
        self.stage = "opening"  # opening | experiment | restore | closed
        self.phase: str | None = None
        self.phase_requests = 0
        self.requests = 0
        self.minute: float | None = None
        self.abort: dict | None = None
        self.cells: dict[str, str] = {}
        self.outcome: str | None = None
        self.verdict: str | None = None
        self.restoration_failed: list[str] | None = None  # None until recorded; then the checks that failed
        self.alarms: list[dict] = []
        self.last_seq = 0
        self._t0_ns: int | None = None
        self._last_at_ns = 0

    def apply(self, seq: int, ev: Event) -> None:
        self.last_seq = seq
        if isinstance(ev, Input):
            self._last_at_ns = max(self._last_at_ns, ev.at_ns)
            if self._t0_ns is not None:
                self.minute = round((self._last_at_ns - self._t0_ns) / NS_PER_MIN, 2)
        if isinstance(ev, WindowOpened):
            self.window_id = ev.window_id
            self.plan = str(ev.plan.get("name", ""))
            self.rehearsal = ev.rehearsal
            timing = ev.plan.get("timing") or {}
            self.stop_min, self.window_min = timing.get("stop_min"), timing.get("window_min")
        elif isinstance(ev, TimeMarked):
            if ev.mark == "t0":
                self._t0_ns = self._last_at_ns
                self.stage = "experiment"
            self.minute = ev.minute
        elif isinstance(ev, PhaseStarted):
            self.phase, self.phase_requests, self.minute = ev.phase, 0, ev.minute
        elif isinstance(ev, RequestMeasured):
            self.phase_requests += 1
            self.requests += 1
        elif isinstance(ev, CellRecorded):
            self.cells[ev.phase] = ev.status
            if ev.phase == self.phase:
                self.phase = None
        elif isinstance(ev, AbortDecided):
            self.abort = {"reason": ev.reason, "detail": ev.detail, "minute": ev.minute}
        elif isinstance(ev, RestoreStarted):
            self.stage, self.phase = "restore", None
            if ev.minute is not None:
                self.minute = ev.minute
        elif isinstance(ev, VerdictReached):
            self.verdict = ev.hypothesis
        elif isinstance(ev, RestorationRecorded):
            self.restoration_failed = failed_checks(ev.checks)
        elif isinstance(ev, Alarm):
            self.alarms.append({"kind": ev.kind, "detail": ev.detail})
        elif isinstance(ev, WindowClosed):
            self.stage, self.outcome = "closed", ev.outcome
            if ev.minute is not None:
                self.minute = ev.minute

    def as_dict(self) -> dict:
        return {"window_id": self.window_id, "plan": self.plan, "rehearsal": self.rehearsal, "stage": self.stage,
                "phase": self.phase, "phase_requests": self.phase_requests, "requests": self.requests,
                "minute": self.minute, "stop_min": self.stop_min, "window_min": self.window_min,
                "abort": self.abort, "cells": dict(self.cells), "outcome": self.outcome, "verdict": self.verdict,
                "restoration_failed": self.restoration_failed, "alarms": list(self.alarms), "last_seq": self.last_seq}

