"""Calibration: what an earlier window measured (tokens per body, pace, load time) from its log's events."""

from __future__ import annotations

from collections.abc import Iterable

from flare_diag.events.base import Event
from flare_diag.events.schema import NS_PER_S, ActionDone, ActionRequested, Input, WindowOpened
from flare_diag.policies.planner import Calibration
from flare_diag.policies.audit import WindowReplay


class CalibrationError(ValueError):
    pass


# what a measured calibration can physically be: a pace of a hundredth to a hundred times the rate
# model, at most an hour of overhead a request and a day a load, token counts a host can serve
BOUNDS = {"pace": (0.01, 100.0), "overhead_s": (0.0, 3600.0), "load_s": (0.0, 86_400.0), "time_scale": (1e-6, 1e6)}
TOKEN_BOUND = 10_000_000


def check_calibration(cal: Calibration, source: str) -> Calibration:
    """`cal` when every value is finite and physically meaningful; CalibrationError naming the first
    that is not (a forged or broken log must not bypass the forecast's refusal)."""
    import math
    for f, (lo, hi) in BOUNDS.items():
        v = getattr(cal, f)
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and lo <= v <= hi):
            raise CalibrationError(f"{source}: calibration {f} = {v!r}: expected between {lo:g} and {hi:g}")
    for f in ("completion_tokens", "prompt_tokens"):
        for k, v in getattr(cal, f).items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v <= TOKEN_BOUND):
                raise CalibrationError(f"{source}: calibration {f}[{k[:16]}] = {v!r}: expected 0 to {TOKEN_BOUND}")
    if not 0 <= cal.rounds <= 10_000_000:
        raise CalibrationError(f"{source}: calibration rounds = {cal.rounds}: expected 0 to 10000000")
    return cal


def calibrate(events: Iterable[Event], source: str) -> Calibration:
    """Replays one window's recorded inputs into a fresh policy, whose estimator learns exactly
    what it learned during the window (policies/audit.py's replayer), and times the window's candidate loads."""
    replay = WindowReplay(follow=True)
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
        elif isinstance(ev, ActionRequested) and ev.action == "load" and ev.args.get("label") != "incumbent":
            load_started[ev.action_id] = last_at
        replay.feed(0, "", ev)
    if opened is None:
        raise CalibrationError(f"{source}: no window in this log")
    est = replay.policy.est
    if est is None or est.rounds == 0:
        raise CalibrationError(f"{source}: window {opened.window_id} sent no replayed request to learn from")
    cal = est.learned(f"{source} ({opened.window_id}, {est.rounds} rounds)", opened.time_scale)
    cal.load_s = round(sum(loads) / len(loads), 3) if loads else None
    return check_calibration(cal, source)
