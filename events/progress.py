"""Live progress of a window (stage, phase, requests, minute, aborts): what `status` and `watch` show,
read from the one window fold (events.window_fold) that the report reads too."""

from __future__ import annotations

from events.window_fold import WindowFold


class WindowProgress(WindowFold):
    """`apply` each of the window's events in seq order; `as_dict` is the status reply's `window`."""

    def as_dict(self) -> dict:
        return {"window_id": self.window_id, "plan": self.plan, "rehearsal": bool(self.rehearsal), "stage": self.stage,
                "phase": self.phase, "phase_requests": self.phase_requests, "requests": self.requests,
                "minute": self.minute, "stop_min": self.stop_min, "window_min": self.window_min,
                "abort": self.abort, "cells": {p: c["status"] for p, c in self.cells.items()}, "outcome": self.outcome,
                "verdict": (self.verdict or {}).get("hypothesis"), "restoration_failed": self.restoration_failed,
                "alarms": list(self.alarms), "last_seq": self.last_seq}

