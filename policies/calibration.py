"""Calibration: what an earlier window measured (tokens per body, pace, load time) from its log's events."""

from __future__ import annotations

from collections.abc import Iterable

from flare_diag.events.base import Event
from flare_diag.events.schema import ActionDone, ActionRequested, Input, WindowOpened
from flare_diag.events.schema import NS_PER_S
from flare_diag.policies.planner import Calibration
from flare_diag.policies.window import WindowPolicy


class CalibrationError(ValueError):
    pass


def calibrate(events: Iterable[Event], source: str) -> Calibration:
    """Replays one window's recorded inputs into a fresh policy, whose estimator learns exactly
    what it learned during the window, and times the window's candidate loads."""
    pol = WindowPolicy()
    opened: WindowOpened | None = None
    last_at = 0
    load_started: dict[int, int] = {}
    loads: list[float] = []
    for ev in events:
        if isinstance(ev, Input):
            if isinstance(ev, WindowOpened):
                if opened is not None:
                    break  # one window
                opened = ev
            if isinstance(ev, ActionDone) and ev.action_id in load_started and ev.ok:
                loads.append((ev.at_ns - load_started.pop(ev.action_id)) / NS_PER_S)
            last_at = ev.at_ns
            pol.receive(ev)
        elif isinstance(ev, ActionRequested) and ev.action == "load" and ev.args.get("label") != "incumbent":
            load_started[ev.action_id] = last_at
    if opened is None:
        raise CalibrationError(f"{source}: no window in this log")
    est = pol.est
    if est is None or est.rounds == 0:
        raise CalibrationError(f"{source}: window {opened.window_id} sent no replayed request to learn from")
    cal = est.learned(f"{source} ({opened.window_id}, {est.rounds} rounds)", opened.time_scale)
    cal.load_s = round(sum(loads) / len(loads), 3) if loads else None
    return cal
