"""`plan forecast --simulate N`: N seeded model runs of a plan (daemon/rehearsal/modelrun.py), summarised.

Where `plan forecast` gives the one schedule the plan's rates imply, a simulation draws the simulator's
service-time spread N times and says how often the window would go well: the share of runs that
measure every required cell, each phase's end minute as a distribution, and the share of runs whose
restore ends inside the reservation.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor

import msgspec

from flare_diag.daemon.hosts.fixture import Fixture
from flare_diag.policies.plan import Plan
from flare_diag.policies.planner import Calibration

MAX_RUNS = 10_000
QUANTILES = (("p10", 10), ("p50", 50), ("p90", 90))
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class PhaseEnds(msgspec.Struct):
    phase: str
    required: bool
    ended: int  # runs in which the phase ran to its end (measured, failed or invalid)
    measured: int
    min: float | None
    p10: float | None
    p50: float | None
    p90: float | None
    max: float | None


class Simulation(msgspec.Struct):
    plan: str
    scenario: str
    runs: int
    seeds: list[int]  # first and last
    every_required_measured: float  # share of runs
    restore_within_reservation: float
    outcomes: dict[str, int]
    phases: list[PhaseEnds]
    required: list[str]

    def render(self) -> list[str]:
        pct = lambda x: f"{x * 100:.1f}%"  # noqa: E731
        lines = [f"simulated {self.runs} windows of {self.plan} against flaresim ({self.scenario}), seeds "
                 f"{self.seeds[0]}-{self.seeds[1]}, in virtual time:",
                 f"  every required cell measured: {pct(self.every_required_measured)} of runs",
                 f"  restore finished inside the reservation: {pct(self.restore_within_reservation)} of runs",
                 "  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())),
                 f"  {'phase':<22} {'ended':>6} {'measured':>8}  end minute: {'min':>6} {'p10':>6} {'p50':>6} {'p90':>6} {'max':>6}"]
        for p in self.phases:
            f = lambda v: "     —" if v is None else f"{v:6.1f}"  # noqa: E731
            lines.append(f"  {p.phase + (' *' if p.required else ''):<22} {p.ended:>6} {p.measured:>8}  "
                         f"            {f(p.min)} {f(p.p10)} {f(p.p50)} {f(p.p90)} {f(p.max)}")
        lines.append("  (* required)")
        return lines


def _quantile(xs: list[float], q: int) -> float:
    """Nearest rank: a minute one of the runs really ended at."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))]


def _runs(plan_raw: bytes, plan: Plan, scenario: str, fixtures: dict[str, Fixture], seeds: list[int],
          calibration: Calibration | None) -> list[dict]:
    from flare_diag.daemon.rehearsal.modelrun import ModelRun
    from flare_diag.daemon.simulator import load_scenario
    sc = load_scenario(scenario)
    out = []
    for seed in seeds:
        r = ModelRun(plan_raw, plan, sc, fixtures, seed, calibration).run()
        out.append({"seed": seed, "outcome": r.outcome,
                    "cells": {k: (c["status"], c["ended_minute"]) for k, c in r.cells.items()},
                    "within_reservation": (r.restoration or {}).get("within_reservation")})
    return out


def _die_with(parent: int) -> None:
    """A worker ends when the command that started it does, however that ends (SIGKILL included):
    Linux's parent-death signal; elsewhere the worker ends at its next chunk."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os._exit(1)


def simulate(plan_raw: bytes, plan: Plan, scenario: str, fixtures: dict[str, Fixture], runs: int, first_seed: int = 0,
             calibration: Calibration | None = None, workers: int | None = None) -> Simulation:
    seeds = list(range(first_seed, first_seed + runs))
    workers = max(1, min(workers or os.cpu_count() or 1, runs))
    if workers == 1:
        results = _runs(plan_raw, plan, scenario, fixtures, seeds, calibration)
    else:
        # fork where there is one: the workers start with this process's warm tokenizer and caches
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        chunks = [seeds[i::workers] for i in range(workers)]
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_die_with, initargs=(os.getpid(),)) as pool:
            parts = list(pool.map(_runs, *zip(*[(plan_raw, plan, scenario, fixtures, c, calibration) for c in chunks])))
        results = sorted((r for part in parts for r in part), key=lambda r: r["seed"])
    required = [p.id for p in plan.phases if not p.optional]
    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[r["outcome"] or "open"] = outcomes.get(r["outcome"] or "open", 0) + 1
    every = sum(all(r["cells"].get(p, ("",))[0] == "measured" for p in required) for r in results)
    inside = sum(r["within_reservation"] is True for r in results)
    names: dict[str, None] = {}  # every cell any run recorded, in the order the windows recorded them
    for r in results:
        names.update(dict.fromkeys(r["cells"]))
    phases = []
    for name in names:
        ends = [r["cells"][name][1] for r in results if name in r["cells"] and r["cells"][name][1] is not None]
        measured = sum(r["cells"].get(name, ("",))[0] == "measured" for r in results)
        qs = {k: _quantile(ends, q) if ends else None for k, q in QUANTILES}
        phases.append(PhaseEnds(name, name in required, len(ends), measured, min(ends) if ends else None,
                                max=max(ends) if ends else None, **qs))
    return Simulation(plan.name, scenario, runs, [seeds[0], seeds[-1]], every / runs, inside / runs, outcomes, phases,
                      required)
