"""Live progress of a window (stage, phase, requests, minute, aborts, the actions it waits on): what
`status` and `watch` show, read from the one window fold (events.window_fold) that the report reads too."""

from __future__ import annotations

from typing import Any

from flare_diag.events.base import Event
from flare_diag.events.schema import ActionDone, ActionRequested, CancelRequested, PhaseStarted, RequestDone, WindowClosed
from flare_diag.events.window_fold import WindowFold


class WindowProgress(WindowFold):
    """`apply` each of the window's events in seq order; `as_dict` is the status reply's `window`."""

    def __init__(self, window_id: str = "") -> None:
        super().__init__(window_id)
        self._validation: int | None = None  # the action id of the fixture validation, until it answers
        self.phase_started_minute: float | None = None
        # action id -> the action asked and not yet answered, with the window minute it was asked at: what
        # an operator needs when a window seems to stand still (an unload the manager has not answered)
        self.waiting: dict[int, dict[str, Any]] = {}

    def apply(self, seq: int, ev: Event, wall_ns: int | None = None) -> None:
        super().apply(seq, ev, wall_ns)
        self._track_waiting(ev)
        if isinstance(ev, PhaseStarted):
            self.phase_started_minute = ev.minute
        # the fixture sizes give each phase its request total (done/total in the live view)
        if isinstance(ev, ActionRequested) and ev.action == "validate_fixtures":
            self._validation = ev.action_id
        elif isinstance(ev, ActionDone) and ev.action_id == self._validation:
            self._validation = None
            fixtures = (ev.data or {}).get("fixtures") if ev.ok and isinstance(ev.data, dict) else None
            for name, f in (fixtures or {}).items():
                if isinstance(f, dict) and isinstance(f.get("sha256"), list):
                    self.fixture_sizes[name] = len(f["sha256"])

    def _track_waiting(self, ev: Event) -> None:
        if isinstance(ev, ActionRequested):
            self.waiting[ev.action_id] = {"action_id": ev.action_id, "action": ev.action, "since_minute": self.minute,
                                          "deadline_s": ev.deadline_s, "experimental": ev.experimental,
                                          "cancelled": False}
        elif isinstance(ev, (ActionDone, RequestDone)):
            self.waiting.pop(ev.action_id, None)
        elif isinstance(ev, CancelRequested):  # still in flight until the runner answers that it stopped
            for aid in ev.action_ids:
                if aid in self.waiting:
                    self.waiting[aid] = {**self.waiting[aid], "cancelled": True}
        elif isinstance(ev, WindowClosed):
            self.waiting.clear()

    @property
    def phase_projected_end(self) -> float | None:
        """When the current phase ends at the pace its own requests have kept so far (its start's estimate
        is the plan's rates, or an earlier phase's pace): None before its second request or without a total."""
        total, done, start, now = self.phase_total, self.phase_requests, self.phase_started_minute, self.minute
        if not total or done < 2 or start is None or now is None or now <= start:
            return None
        return start + (now - start) * max(total, done) / done

    def as_dict(self) -> dict[str, Any]:
        return {"window_id": self.window_id, "plan": self.plan, "rehearsal": bool(self.rehearsal), "stage": self.stage,
                "phase": self.phase, "phase_requests": self.phase_requests, "phase_total": self.phase_total,
                "phase_estimated_end_minute": self.phase_estimated_end,
                "phase_projected_end_minute": self.phase_projected_end, "requests": self.requests,
                "requests_planned": self.requests_planned,
                "minute": self.minute, "stop_min": self.stop_min, "window_min": self.window_min,
                "abort": self.abort, "cells": {p: c["status"] for p, c in self.cells.items()}, "outcome": self.outcome,
                "verdict": (self.verdict or {}).get("hypothesis"), "restoration_failed": self.restoration_failed,
                "restoration_verified": None if self.restoration is None else bool(self.restoration.get("verified")),
                "host_changed": self.host_changed,
                "alarms": list(self.alarms), "last_seq": self.last_seq,
                "waiting": [self.waiting[aid] for aid in sorted(self.waiting)]}
