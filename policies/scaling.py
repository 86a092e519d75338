"""A scaled clock and the plan's bounds: the real-seconds floors, the bounds they raise, the largest honest scale.

Only a simulated site runs on a scaled clock (`--time-scale F`: F window seconds a wall second). A
bound the daemon must observe in real time (a watch's silence, a drain's consecutive scrapes) cannot
shrink below a few real seconds, which a loaded machine's poll can take; at a high scale that floor
raises the bound in window time. Every such raise is said (`report.json` `scaled_bounds`, the cells,
Needs attention), and a scale so high that a raised bound would no longer fit the window is refused.
"""

from __future__ import annotations

import math

import msgspec

from flare_diag.policies.plan import Plan, Timing

WATCH_LOST_MIN_REAL_S = 5.0  # a watch's silence is judged over no less than this much real time
DRAIN_MIN_REAL_S = 5.0  # a drain's bound never shrinks below this much real time
STALL_MIN_REAL_S = 5.0  # a generation's stream is never called stalled after less real silence than this

# bound -> (the Timing field, its real-seconds floor, why the floor is there)
FLOORED = {
    "timing.watch_lost_s": ("watch_lost_s", WATCH_LOST_MIN_REAL_S,
                            "a watch is polled in real time: its silence is judged over at least {floor:g} real s"),
    "timing.drain_timeout_s": ("drain_timeout_s", DRAIN_MIN_REAL_S,
                               "a drain needs consecutive real scrapes: it is given at least {floor:g} real s"),
    "timing.quiesce_drain_timeout_s": ("quiesce_drain_timeout_s", DRAIN_MIN_REAL_S,
                                       "a drain needs consecutive real scrapes: it is given at least {floor:g} real s"),
    "timing.stall_s": ("stall_s", STALL_MIN_REAL_S,
                       "a stream's silence is timed in real time: it is given at least {floor:g} real s"),
}


class ScaledBound(msgspec.Struct):
    """One bound a real-seconds floor raised (contract 4, amended 2026-12-03)."""

    bound: str
    plan_s: float
    effective_s: float
    reason: str


def effective_s(planned: float, floor_real_s: float, scale: float) -> float:
    """A bound in window seconds under a clock scaled by `scale`: the plan's, or the floor's if higher."""
    return max(planned, floor_real_s * scale)


def scaled_bounds(timing: Timing, scale: float) -> list[ScaledBound]:
    """Every bound the floors raise at `scale`; empty at x1 (and in virtual time, which is x1)."""
    out = []
    for bound, (field, floor, why) in FLOORED.items():
        planned = getattr(timing, field)
        eff = effective_s(planned, floor, scale)
        if eff > planned:
            out.append(ScaledBound(bound, planned, round(eff, 3), why.format(floor=floor) + f", x{scale:g}"))
    return out


def max_time_scale(plan: Plan) -> float:
    """The largest scale at which every raised bound still fits the window: a closing drain at its floor
    (past the stop minute) must leave the restore its expected time within the reserve, and no watch or
    drain may be allowed longer than the whole reserve."""
    reserve_s = plan.timing.restore_reserve_min * 60
    limits = [(reserve_s - plan.rates.restore_expected_s()) / DRAIN_MIN_REAL_S, reserve_s / WATCH_LOST_MIN_REAL_S,
              reserve_s / DRAIN_MIN_REAL_S]
    return max(1.0, min(limits))


def time_scale_error(plan: Plan, scale: float) -> str | None:
    """Why `scale` cannot run this plan, in one line, or None."""
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 1):
        return f"time_scale {scale}: expected a finite factor of at least 1 (window seconds a wall second)"
    top = max_time_scale(plan)
    if scale > top:
        return (f"time_scale {scale:g}: expected at most {math.floor(top):g} for this plan: above it a raised drain or "
                f"watch bound ({DRAIN_MIN_REAL_S:g} real s x{scale:g}) would no longer fit timing.restore_reserve_min = "
                f"{plan.timing.restore_reserve_min:g}")
    return None
