"""A window decider's data as a value (`WindowSnapshot`): what `log state` prints and the tests compare."""

from __future__ import annotations

from flare_diag.policies.core import WindowCore
from flare_diag.policies.driver import Act, Quiet, Sleep
from flare_diag.policies.state import Outstanding, Waiting, WindowSnapshot, Working


def _waiting(w: WindowCore) -> Waiting | None:
    if w.gen is None:
        return None
    wait = w.wait
    if isinstance(wait, Act):
        return Waiting(actions=tuple(wait.ids))
    if isinstance(wait, Sleep):
        return Waiting(until_minute=w.minute(wait.until_ns))
    if isinstance(wait, Quiet):
        return Waiting(quiet=True)
    return Waiting()


# the driver's own helpers: what they wait for is `waiting`
_DRIVER_STEPS = frozenset({"act", "act_all"})


def _procedure(w: WindowCore) -> tuple[str, ...]:
    """The running procedure's generators, outermost first, by name (experiment, run_arm, drain, ...)."""
    names: list[str] = []
    gen: object = w.gen
    while gen is not None and hasattr(gen, "gi_code"):
        name = gen.gi_code.co_name
        if name not in _DRIVER_STEPS:
            names.append(name)
        gen = getattr(gen, "gi_yieldfrom", None)
    return tuple(names)


def _restore_end_minute(w: WindowCore) -> float | None:
    return None if w.restore_end_ns is None else w.minute(w.restore_end_ns)


def _working(w: WindowCore) -> Working:
    est = w.est
    return Working(
        pace=None if est is None else est.pace, overhead_s=None if est is None else est.overhead_s,
        rounds=0 if est is None else est.rounds, load_s=None if est is None else est.load_s,
        resident_baseline_bytes=w.baseline.resident, growth_excess_runs=w.baseline.excess_runs,
        drained_counters=w.last_counters, incarnation_counters=dict(w.restart_watch.counters),
        process_start_time=w.restart_watch.start_time, prompts_seen=len(w.prompt_seen), xids_known=w.xids_known,
    )


def snapshot(w: WindowCore, inputs: int = 0) -> WindowSnapshot:
    """`w`'s state after its latest input; `inputs`: how many it has taken (the caller counts them)."""
    return WindowSnapshot(
        window_id=w.window_id, stage=w.stage.value, inputs=inputs, minute=w.minute(),
        stop_minute=w.plan.timing.stop_min if w.plan is not None else None,
        cells=dict(w.ledger.cells), required=tuple(w.required),
        running=w.current, waiting=_waiting(w), procedure=_procedure(w),
        outstanding=tuple(Outstanding(aid, action, exp) for aid, (action, exp) in sorted(w.pending.items())),
        abort=w.abort, incumbent=w.incumbent, took_down=w.took_down,
        candidate_loaded=w.candidate_loaded, candidate_id=w.candidate_id,
        failed_incarnations=dict(w.failed_incarnations), unverified_incarnations=dict(w.unverified_incarnations),
        verified_incarnations=tuple(sorted(w.verified_identity)),
        watch_answered_minute={s: w.minute(ns) for s, ns in sorted(w.watch_last.items())},
        watch_failure=dict(sorted(w.watch_failure.items())), rules_disabled=tuple(sorted(w.rules_disabled)),
        guard_runs=dict(sorted(w.guard_runs.runs.items())),
        stop_marked=w.stop_marked, overrun_marked=w.overrun_marked, trace_stopped=w.trace_stopped,
        restore_cause=w.restore_cause, restore_started_minute=w.restore_started,
        restore_end_minute=_restore_end_minute(w), restore_faults=tuple(w.restore_faults),
        restore_restarts=w.restore_restarts, restore_unloaded=w.restore_unloaded,
        incumbent_back=w.incumbent_back,
        readmit_requested=w.readmit_requested, working=_working(w),
    )
