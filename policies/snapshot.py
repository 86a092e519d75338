"""A window decider's data as a value (`WindowSnapshot`): what `log state` prints and the tests compare."""

from __future__ import annotations

from flare_diag.policies.core import WindowCore
from flare_diag.policies.driver import Act, Quiet, Sleep
from flare_diag.policies.state import Outstanding, Waiting, WindowSnapshot, Working


def _waiting(w: WindowCore) -> Waiting | None:
    if w.gen is None:
        return None
    wait = w.state.waits
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
    return None if w.state.restore_end_ns is None else w.minute(w.state.restore_end_ns)


def _working(w: WindowCore) -> Working:
    est = w.est
    return Working(
        pace=None if est is None else est.pace, overhead_s=None if est is None else est.overhead_s,
        rounds=0 if est is None else est.rounds, load_s=None if est is None else est.load_s,
        resident_baseline_bytes=w.state.baseline.resident, growth_excess_runs=w.state.baseline.excess_runs,
        drained_counters=w.state.last_counters, incarnation_counters=dict(w.state.restart_watch.counters),
        process_start_time=w.state.restart_watch.start_time, prompts_seen=len(w.state.prompt_seen),
        answers_seen=len(w.state.answers_seen), xids_known=w.state.xids_known,
    )


def snapshot(w: WindowCore, inputs: int = 0) -> WindowSnapshot:
    """`w`'s state after its latest input; `inputs`: how many it has taken (the caller counts them)."""
    return WindowSnapshot(
        window_id=w.window_id, stage=w.state.stage.value, inputs=inputs, minute=w.minute(),
        stop_minute=w.plan.timing.stop_min if w.plan is not None else None,
        cells=dict(w.state.cells), required=tuple(w.required),
        running=w.state.current, waiting=_waiting(w), procedure=_procedure(w),
        outstanding=tuple(Outstanding(aid, a.request.name, a.experimental) for aid, a in sorted(w.state.asked.items())),
        abort=w.state.abort, incumbent=w.state.incumbent, took_down=w.state.took_down,
        candidate_loaded=w.state.candidate_loaded, candidate_id=w.state.candidate_id,
        failed_incarnations=dict(w.state.failed_incarnations), unverified_incarnations=dict(w.state.unverified_incarnations),
        verified_incarnations=tuple(sorted(w.state.verified_identity)),
        watch_answered_minute={s: w.minute(ns) for s, ns in sorted(w.state.watch_last.items())},
        watch_failure=dict(sorted(w.state.watch_failure.items())), rules_disabled=tuple(sorted(w.state.rules_disabled)),
        guard_runs=dict(sorted(w.state.guard_runs.runs.items())),
        stop_marked=w.state.stop_marked, overrun_marked=w.state.overrun_marked, trace_stopped=w.state.trace_stopped,
        restore_cause=w.state.restore_cause, restore_started_minute=w.state.restore_started,
        restore_end_minute=_restore_end_minute(w), restore_faults=tuple(w.state.restore_faults),
        restore_restarts=w.state.restore_restarts, restore_unloaded=w.state.restore_unloaded,
        incumbent_back=w.state.incumbent_back,
        readmit_requested=w.state.readmit_requested, working=_working(w), loads_stopped=w.state.loads_stopped,
    )
