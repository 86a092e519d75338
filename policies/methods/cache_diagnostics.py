"""The seed's method (2026-10-22): its arms by incarnation, each phase's prime, replay and drains, the
order probe's verdict (contract section 4)."""

from __future__ import annotations

from flare_diag.events.schema import NS_PER_S, ArmStarted
from flare_diag.policies import interpret
from flare_diag.policies.core import WindowCore
from flare_diag.policies.driver import Interrupt, Proc
from flare_diag.policies.method import Method
from flare_diag.policies.phases import check_projection, fresh_incarnation, run_phase
from flare_diag.policies.plan import Plan
from flare_diag.policies.planner import Arm, trace_order_stopped
from flare_diag.policies.verdicts import Cells


def run(w: WindowCore) -> Proc:
    """The plan's arms in order, each only where it fits before the stop minute."""
    for arm in w.arms:
        if w.now >= w.stop_ns():  # reached while a phase's closing drain ran on
            w.mark_stop()
            raise Interrupt("stop_minute")
        if arm.loads and (why := undecidable(w)):
            for p in arm.phases:
                w.record_cell(p.id, "deferred", why, comparable=p.comparable)
            continue
        yield from run_arm(w, arm)


def undecidable(w: WindowCore) -> str | None:
    """Why no arm loaded from here on could decide anything: the order probe's own cell ran on an incarnation
    that did not start cold, so the verdict cannot come whatever a later arm measures, and a later
    incarnation on the same host may meet the same cache. The primary is not kept out for it."""
    probe = w.state.cells.get(interpret.ORDER_PROBE)
    if probe is None or not probe.not_fresh:
        return None
    return (f"not started: earlier result: {interpret.ORDER_PROBE}'s incarnation did not start cold, so "
            f"the order probe cannot run whatever this arm measures, and an incarnation loaded on the same host may "
            f"start with the same state: no primary downtime spent on it")


def run_arm(w: WindowCore, arm: Arm) -> Proc:
    """An arm starts only when its gating phases fit before the stop minute less the plan's margin, by
    the estimate now; otherwise every phase of it is deferred, and no primary downtime is spent
    priming an arm whose replay could not run."""
    t = w.plan.timing
    if all(p.id in w.state.cells for p in arm.phases):
        return
    if arm.trace_pair and w.state.trace_stopped:
        for p in arm.phases:
            w.record_cell(p.id, "deferred", w.state.trace_stopped, comparable=p.comparable)
        return
    label = arm.incarnation
    if label in w.state.failed_incarnations or label in w.state.unverified_incarnations:
        for p in arm.phases:
            if label in w.state.failed_incarnations:
                w.record_cell(p.id, "failed", w.state.failed_incarnations[label], comparable=p.comparable)
            else:
                w.record_cell(p.id, "invalid", w.state.unverified_incarnations[label], comparable=False)
        return
    if arm.loads and w.state.loads_stopped:
        for p in arm.phases:
            w.record_cell(p.id, "failed", f"not started: {w.state.loads_stopped}", comparable=p.comparable)
        return
    if not arm.loads and label != w.state.candidate_loaded:
        why = f"not started: incarnation {label} is not loaded (its own arm did not run), and this arm does not verify one"
        for p in arm.phases:
            w.record_cell(p.id, "deferred", why, comparable=p.comparable)
        return
    need = w.est.arm_s(arm, w.state.candidate_loaded, done=set(w.state.cells))
    end = w.now + int(need * NS_PER_S)
    limit = w.stop_ns() - int(t.arm_margin_min * 60 * NS_PER_S)
    if end > limit:
        gating = [p.id for p in arm.gating if p.id not in w.state.cells]
        why = (f"not started: arm {arm.id} ({', '.join(gating)}) would end at minute {w.minute(end):.1f} by the "
               f"current estimate, past the stop minute {t.stop_min:g} less the margin of {t.arm_margin_min:g} min")
        for p in arm.phases:
            w.record_cell(p.id, "deferred", why, comparable=p.comparable)
        if arm.trace_pair:
            w.trace_order_stopped(trace_order_stopped(arm))
        check_projection(w)
        return
    w.emit(ArmStarted(arm=arm.id, phases=[p.id for p in arm.phases], minute=w.minute(),  # type: ignore[arg-type]  # an arm starts after the quiesce: a minute, never None
                       estimated_end_minute=w.minute(end), limit_minute=w.minute(limit),  # type: ignore[arg-type]  # after the quiesce: minutes, never None
                       pace=round(w.est.pace, 4), overhead_s=round(w.est.overhead_s, 3)))
    if label != w.state.candidate_loaded:
        ok = yield from fresh_incarnation(w, label)
        if not ok:
            for p in arm.phases:
                w.record_cell(p.id, "failed", w.state.failed_incarnations[label], comparable=p.comparable)
            return
    for ph in arm.phases:
        yield from run_phase(w, ph)


def rule(plan: Plan, cells: Cells) -> tuple[str, str, str]:
    return interpret.hypothesis(cells, plan.verdict.tier)


METHOD = Method(name="cache_diagnostics", summary="where host-cache reuse is lost: lookup, hit, restore or reuse "
                "(the order probe of contract section 4)", run=run, rule=rule, findings=interpret.findings)
