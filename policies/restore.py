"""The restore procedure: the exact incumbent back, containment, monitoring and both paths checked."""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from flare_diag.events.answers import (
    Backend,
    GpuView,
    Identity,
    LoadedRecipe,
    ManagerState,
    MetricsSample,
    MonitoringView,
    RouterView,
    read,
)
from flare_diag.events.answers import SteadyState as SteadyStateAnswer
from flare_diag.events.schema import NS_PER_MIN, NS_PER_S, Alarm, RestorationRecorded, VerdictReached, WindowClosed
from flare_diag.policies import guards, rules, steady
from flare_diag.policies.core import WindowCore
from flare_diag.policies.drain import drain
from flare_diag.policies.driver import Proc, Quiet, Sleep
from flare_diag.policies.restore_reads import admitted_settled, monitoring_settled, pause, read_again, read_identity


def last_gate(w: WindowCore, identity: dict[str, Any]) -> Generator[Any, Any, tuple[list[str], Any]]:
    """Right before the primary is readmitted: every rule that aborts an experiment, applied to the
    restored incumbent. The router (the quiesced backend still out, nothing in flight), the GPUs (no
    new Xid, memory under its bound, the same UUIDs and power limits), the engine (idle: every drain
    gauge at zero; within its growth bounds, resident memory not grown past the bound since the
    restore's first observation) and the identity (the incumbent's as read before the take-down).
    Each breach, as a sentence (any one keeps the primary out), and the router's answer it read."""
    plan = w.plan
    router, gpu, m, ident = yield from w.act_all([("snapshot", {"what": "router"}), ("snapshot", {"what": "gpu"}),
                                                   ("scrape_metrics", {}), ("read_identity", {})])
    out = []
    before = "before readmit"
    ctx = guards.Context(plan.growth, w.state.snapshots.get("gpu"), w.state.snapshots.get("router"))
    if w.state.snapshots.get("router") is not None and not (w.state.abort and w.state.abort.reason == "containment"):
        if not router.ok:
            out.append(f"containment: the router could not be read before readmit ({router.detail or router.error})")
        elif hit := guards.judge("router", router.data, ctx):
            out.append(f"{hit[0]}: {before}: {hit[1]}")
    if w.state.snapshots.get("gpu") is not None:
        if not gpu.ok:
            out.append(f"gpu_fault: the GPU view could not be read before readmit ({gpu.detail or gpu.error})")
        else:
            new = (gpu.data.get("xid_events") or [])[w.state.xids_known:]  # the Xids the watch has not judged yet
            w.xids_judged(len(new))
            if hit := guards.judge("gpu", {**gpu.data, "xid_events": new}, ctx):
                out.append(f"{hit[0]}: {before}: {hit[1]}")
    if not m.ok:
        out.append(f"uncontrolled_growth: the engine's metrics could not be read before readmit ({m.detail or m.error})")
    else:
        gauges = read(MetricsSample, m).gauges
        hit = guards.action_observation(m.data, None, True, plan.growth, plan.identity.host_cache_bytes)
        if hit:
            out.append(f"{hit[0]}: before readmit: {hit[1]}")
        resident, first = gauges.get("resident_bytes"), w.state.restore_resident
        if resident is not None and first is not None and resident - first > plan.growth.max_resident_growth_bytes:
            out.append(f"uncontrolled_growth: before readmit the incumbent's resident memory grew "
                       f"{(resident - first) / 2**30:.1f} GiB since it loaded, beyond the bound "
                       f"{plan.growth.max_resident_growth_bytes / 2**30:.1f} GiB")
    # idle before it takes traffic: every drain gauge at zero within the drain timeout, with no request
    # of the window in flight (a scheduler queue that grows by itself never settles)
    drained = yield from drain(w, plan.timing.drain_timeout_s, "before readmit")
    if not drained.settled:
        # the busy gauges the gate's own scrape showed (the words every earlier build wrote), else what held
        # the drain's last answered scrape: never a claim of load nobody saw
        idle = read(MetricsSample, m).gauges if m.ok else {}
        busy = ", ".join(f"{g} = {v:g}" for g in rules.DRAIN_GAUGES if (v := idle.get(g)))
        seen = f" ({busy or drained.held})" if busy or drained.held else ""
        out.append(f"uncontrolled_growth: before readmit the incumbent did not drain within {w.drain_timeout_s(plan.timing.drain_timeout_s):g} s "
                   f"with no request of the window in flight{seen}{drained.unanswered_words()}")
    if not ident.ok:
        out.append(f"identity_drift: the identity could not be read before readmit ({ident.detail or ident.error})")
    elif identity:
        # the restored incumbent is a new incarnation of the same recipe: all else is held
        held = {k: v for k, v in identity.items() if k not in ("trace_enabled", "incarnation")}
        ictx = guards.Context(plan.growth, identity=held,
                              where=f"{before} the incumbent's identity differs from before the take-down")
        if hit := guards.judge("identity", {"identity": ident.data}, ictx):
            out.append(f"{hit[0]}: {hit[1]}")
    return out, router


STEADY_AFTER_MAX_MIN = 5.0  # how long after the readmission the guards are waited for


def steady_state_after(w: WindowCore) -> Proc:
    """The steady-state guards after the readmission, until every enforced guard holds or the window's
    end is near: a rate over the last minute still holds the window's breach for a while, so one
    evaluation right after the readmit would blame the pool for the past. A pool that has not
    recovered is an alarm for a person; the incumbent's restoration stands on its own checks."""
    if not w.steady_state or not w.plan.guards:
        return
    queries = {g.name: g.query for g in w.plan.guards}
    enforced = w.enforced_guards("restore") or [g for g in w.plan.guards if not g.dry_run]
    step = min(g.interval_s for g in w.plan.guards)
    end = w.now + int(STEADY_AFTER_MAX_MIN * NS_PER_MIN)
    if w.state.t0 is not None:
        end = min(end, w.state.t0 + int(w.plan.timing.window_min * NS_PER_MIN))
    while True:
        res = yield from w.act("steady_state", {"when": "after", "queries": queries})
        said = read(SteadyStateAnswer, res).guards if res.ok else {}
        broken = []
        for g in enforced:
            value = steady.worst(g, said[g.name].values if g.name in said else [])
            if value is None or steady.breached(g, value):
                broken.append((g, value))
        if not broken:
            return
        if w.now + int(step * NS_PER_S) >= end:
            w.emit(Alarm(kind="steady_state_after", detail=f"the pool's steady state did not hold within "
                                                             f"{STEADY_AFTER_MAX_MIN:g} min of the readmission (or by the "
                                                             f"window end): " + "; ".join(
                f"guard {g.name}: " + ("no number from Prometheus" if v is None else f"{v:.6g} {g.breach_if} {g.threshold:g}")
                for g, v in broken)))
            return
        yield Sleep(w.now + int(step * NS_PER_S))


RESTORE_PASSES = 3  # an engine that keeps restarting under the restore is not one to readmit
UNAVAILABLE_LOAD = ("http_502", "http_503")  # a load refused before the manager did anything with it
LOAD_AGAIN_S = 10.0  # how long after such a refusal the incumbent's load is sent again


def restore(w: WindowCore) -> Proc:
    yield Quiet()
    checks: dict[str, Any] = {}
    identity: dict[str, Any] = {}
    for _pass in range(RESTORE_PASSES):
        seen = w.state.restore_restarts
        checks, identity, breaches, router = yield from restore_pass(w)
        if w.state.restore_restarts == seen:
            break
    else:
        breaches = [f"engine_restart: the engine restarted under each of {RESTORE_PASSES} passes of the restore"]
    for breach in breaches:
        w.restore_fault(breach)
    checks["no_fault_during_restore"] = not w.state.restore_faults
    yield from readmission(w, checks, router)
    if checks.get("readmitted"):
        # what the window may have changed, every field of it, against the identity before the take-down
        after = yield from read_identity(w)
        checks["identity_restored"] = restored_identity(w, identity, after)
        yield from steady_state_after(w)
    if checks.get("monitoring_registered") is False and checks["incumbent_sha256_match"] and checks["direct_preflight"]:
        # the incumbent is back and serves, and monitoring lags a restart by up to a scrape: read it again
        checks["monitoring_registered"] = yield from monitoring_settled(w)
    checks["no_fault_during_restore"] = not w.state.restore_faults  # a fault after the readmit counts too
    # the seed's promise is the incumbent back *within* the reservation: a restore that ends past
    # the window end did not keep it, whatever else it verified
    end = w.state.t0 + int(w.plan.timing.window_min * NS_PER_MIN) if w.state.t0 is not None else None
    checks["within_reservation"] = None if end is None else w.now <= end
    verified = all(v is not False for v in checks.values())
    w.emit(RestorationRecorded(checks=checks, verified=verified, started_minute=w.state.restore_started,
                                finished_minute=w.minute()))
    cells = w.cells
    no_cause = w.state.abort.reason if w.state.abort and w.state.abort.reason in rules.NO_CAUSE_ABORTS else None
    hyp, basis, nxt = w.method.verdict(w.plan, cells, w.required, no_cause)
    w.emit(VerdictReached(hypothesis=hyp, basis=basis, next_experiment=nxt, findings=w.method.findings(cells)))
    # `completed` only when every required cell was measured (contract 4, amended)
    complete = all(w.state.status(p) == "measured" for p in w.required)
    outcome = ("restore_failed" if not verified else "aborted" if w.state.abort else "completed" if complete else "partial")
    w.emit(WindowClosed(outcome=outcome, minute=w.minute()))


def restored_identity(w: WindowCore, before: dict[str, Any], after: Any) -> bool | None:
    """Every contract field of the identity read after the readmission equal to the one read before the
    take-down (the incarnation aside, where the restore loaded the incumbent anew); None: nothing to compare."""
    if not before:
        return None
    changes = rules.restored_changes(before, after.data if after.ok else {}, reloaded=w.state.took_down)
    if not after.ok:
        changes = [f"the identity could not be read after the readmit ({after.detail or after.error})"]
    if changes:
        w.emit(Alarm(kind="identity_not_restored", detail="after the readmit the incumbent's identity differs from "
                                                            "before the take-down: " + "; ".join(changes)))
    return not changes


def restore_pass(w: WindowCore) -> Generator[Any, Any, tuple[dict[str, Any], dict[str, Any], list[str], Any]]:
    """One pass of the restore's checks, from the manager's state to the last gate: (checks, the
    identity the incumbent is held to, the last gate's breaches, the router's latest answer)."""
    checks: dict[str, Any] = {}
    inc = w.state.incumbent
    recipe, sha, identity = (inc.recipe, inc.sha256, inc.identity) if inc else (None, None, {})
    st = yield from w.act("manager_state", {})
    st = yield from read_again(w, "manager_state", {}, st)
    loaded = _loaded(st)
    if not sha and loaded:  # the window stopped before it read the incumbent: keep what is loaded
        recipe, sha, identity = loaded.recipe, loaded.sha256, {}
    if sha and w.state.took_down:  # a window that changed nothing puts nothing back
        if loaded and loaded.sha256 != sha:
            yield from w.act("unload", {"recipe": loaded.recipe, "sha256": loaded.sha256})
        w.restore_unloaded_candidate()
        if not loaded or loaded.sha256 != sha:
            yield from load_incumbent(w, recipe, sha)
    w.incumbent_returned()
    first = yield from w.act("scrape_metrics", {})  # the incumbent's first observation: what it may grow from
    w.incumbent_first_seen(read(MetricsSample, first).gauges.get("resident_bytes") if first.ok else None)
    ident = yield from read_identity(w)
    ident = yield from trace_back(w, identity, ident)
    checks["incumbent_sha256_match"] = bool(ident.ok and sha and read(Identity, ident).recipe_sha256 == sha)
    if checks["incumbent_sha256_match"] and identity:
        drift = rules.identity_mismatches({k: identity.get(k) for k in rules.IDENTITY_FIELDS if k in identity}, ident.data)
        checks["incumbent_sha256_match"] = not drift
    router_snap, gpu_snap = w.state.snapshots.get("router"), w.state.snapshots.get("gpu")
    now_router, now_gpu = yield from w.act_all([("snapshot", {"what": "router"}), ("snapshot", {"what": "gpu"})])
    now_router = yield from read_again(w, "snapshot", {"what": "router"}, now_router)
    now_gpu = yield from read_again(w, "snapshot", {"what": "gpu"}, now_gpu)
    uncontained = _uncontained(router_snap, now_router, gpu_snap, now_gpu)
    # None: nothing to contain (neither a router nor GPUs were snapshotted before the take-down)
    checks["containment"] = None if router_snap is None and gpu_snap is None else not uncontained
    if uncontained:  # "containment failed" alone sends a person to the router for a GPU view that did not answer
        w.emit(Alarm(kind="containment_not_verified", detail="; ".join(uncontained)))
    if gpu_snap is not None and now_gpu.ok:  # an Xid the watch has not reported yet is seen here, before any readmit
        new = read(GpuView, now_gpu).xid_events[w.state.xids_known:]
        if new:
            w.xids_judged(len(new))
            w.restore_fault(f"gpu_fault: Xid {new[0].xid} on GPU {new[0].gpu}")
    mon = yield from w.act("snapshot", {"what": "monitoring"})
    mon = yield from read_again(w, "snapshot", {"what": "monitoring"}, mon)
    if mon.error == "not_applicable":
        checks["monitoring_registered"] = None
    else:
        t = read(MonitoringView, mon).target if mon.ok else None
        checks["monitoring_registered"] = bool(t and t.registered and t.healthy)
    direct = yield from w.act("preflight", {"path": "direct"})
    direct = yield from read_again(w, "preflight", {"path": "direct"}, direct)  # an engine still coming up: 503
    checks["direct_preflight"] = bool(direct.ok)
    if not direct.ok and checks["incumbent_sha256_match"]:  # the incumbent is back but does not serve: say how
        w.emit(Alarm(kind="direct_preflight_failed", detail=f"the incumbent is back but does not serve: "
                                                            f"{direct.detail or direct.error}"))
    # an Xid, an OOM or a containment breach while restoring: the incumbent is not known good
    checks["no_fault_during_restore"] = not w.state.restore_faults
    breaches: list[str] = []
    if w.state.took_down and not [k for k in ("incumbent_sha256_match", "direct_preflight", "containment")
                            if checks[k] is False]:
        # the last gate: every rule that would abort an experiment, applied before the primary goes back
        breaches, now_router = yield from last_gate(w, identity)
    return checks, identity, breaches, now_router


def trace_back(w: WindowCore, identity: dict[str, Any], ident: Any) -> Generator[Any, Any, Any]:
    """The one identity field a window sets itself: put back as it was before the take-down, and read again."""
    want = identity.get("trace_enabled") if identity else None
    if not (ident.ok and isinstance(want, bool) and read(Identity, ident).trace_enabled not in (None, want)):
        return ident
    res = yield from w.act("set_trace", {"enabled": want})
    if not res.ok:
        w.restore_fault(f"identity_drift: the incumbent's trace could not be set back {'on' if want else 'off'} "
                         f"({res.detail or res.error})")
    return (yield from read_identity(w))


def readmission(w: WindowCore, checks: dict[str, Any], router: Any) -> Proc:
    """The primary back in rotation, only when every check of the restore holds; the routed path tried.
    `router`: the restore's latest read of the router's backends."""
    unready = [k for k in ("incumbent_sha256_match", "direct_preflight", "containment", "no_fault_during_restore")
               if checks[k] is False]
    if "router" in w.state.snapshots and w.state.snapshots["router"] is None:  # the site has no router
        checks["readmitted"] = None
        checks["routed_preflight"] = None
    elif not w.state.took_down:  # never quiesced: nothing to readmit, and nothing left quiesced
        checks["readmitted"] = None
        routed = yield from w.act("preflight", {"path": "routed"})
        routed = yield from read_again(w, "preflight", {"path": "routed"}, routed)
        checks["routed_preflight"] = None if routed.error == "not_applicable" else bool(routed.ok)
    elif unready:
        # Routing production traffic to a primary whose restore did not verify would turn a
        # failed window into an outage: it stays quiesced until a person has looked.
        checks["readmitted"] = False
        checks["routed_preflight"] = False
        why = ", ".join(unready) + " failed" + (f" ({'; '.join(w.state.restore_faults)})" if w.state.restore_faults else "")
        w.emit(_not_readmitted(router, why))
    else:
        w.readmit_sent()
        re = yield from w.act("readmit", {})
        checks["readmitted"] = None if re.error == "not_applicable" else (yield from readmitted(w, re))
        routed = yield from w.act("preflight", {"path": "routed"})
        routed = yield from read_again(w, "preflight", {"path": "routed"}, routed)
        checks["routed_preflight"] = None if routed.error == "not_applicable" else bool(routed.ok)


def _not_readmitted(router: Any, why: str) -> Alarm:
    """What a person must know of a primary the window did not readmit: out of rotation, or, where the router's
    own latest view shows it admitted (a supervisor or a person admitted it, not the window), perhaps taking
    traffic on an incumbent whose restore did not verify."""
    backend = read(RouterView, router).backend if router is not None and router.ok else None
    if backend is not None and backend.admitted is True:
        return Alarm(kind="primary_admitted_unverified", detail=(
            f"the router shows backend {backend.id} admitted, though the window did not readmit it: it may be taking "
            f"traffic on an incumbent whose restore did not verify ({why}); take it out of rotation, then check it"))
    return Alarm(kind="primary_left_quiesced", detail=f"not readmitted to the router: {why}")


def readmitted(w: WindowCore, re: Any) -> Generator[Any, Any, bool]:
    """The backend admitted as the router itself shows it after the readmit: the window changed it, so its
    reply alone (which may omit `admitted`, or say it before the router acts on it) verifies nothing."""
    if not re.ok or read(Backend, re).admitted is False:
        w.emit(Alarm(kind="readmit_not_verified", detail="the readmit " + (
            f"failed: {re.detail or re.error}" if not re.ok else "answered that the backend is not admitted")))
        return False
    view = yield from w.act("snapshot", {"what": "router"})
    view = yield from admitted_settled(w, view)
    if view.ok and read(RouterView, view).backend.admitted is True:
        return True
    w.emit(Alarm(kind="readmit_not_verified", detail="after the readmit the router " + (
        f"could not be read ({view.detail or view.error})" if not view.ok else
        f"shows backend {read(RouterView, view).backend.id} admitted {read(RouterView, view).backend.admitted}")
        + ": the primary may still be out of rotation; check the router before anything else"))
    return False


def load_incumbent(w: WindowCore, recipe: str | None, sha: str) -> Proc:
    """The incumbent's load, tried twice. A first load that got no answer may have finished after the window
    stopped waiting: the manager is asked first, and the incumbent it shows loaded is not loaded over. One the
    manager (or a proxy before it) refused as unavailable is tried again a moment later, not at once: a manager
    still releasing what the candidate held refuses the same load again at once."""
    for attempt in range(2):
        r = yield from w.act("load", {"recipe": recipe, "sha256": sha, "label": "incumbent"})
        if r.ok or attempt:
            return
        if r.error == "timeout":
            st = yield from w.act("manager_state", {})
            if (now := _loaded(st)) is not None and now.sha256 == sha:
                return
        elif r.error in UNAVAILABLE_LOAD:
            yield from pause(w, LOAD_AGAIN_S)


def _loaded(st: Any) -> LoadedRecipe | None:
    """What the manager says is loaded; None when it could not say, or names no recipe."""
    return read(ManagerState, st).recipe_loaded() if st.ok else None


def _uncontained(router_snap: Mapping[str, Any] | None, now_router: Any, gpu_snap: Mapping[str, Any] | None,
                 now_gpu: Any) -> list[str]:
    """Why the router and the GPUs as the restore reads them are not as they were before the take-down, each
    as a sentence: a read that failed is said as one, never as a change."""
    out: list[str] = []
    if router_snap is not None:
        if not now_router.ok:
            out.append(f"the router could not be read ({now_router.detail or now_router.error})")
        elif (now := read(RouterView, now_router).config_sha256) != router_snap.get("config_sha256"):
            out.append(f"the router's configuration sha256 was {router_snap.get('config_sha256')}, now {now}")
    if gpu_snap is not None:
        if not now_gpu.ok:
            out.append(f"the GPU view could not be read ({now_gpu.detail or now_gpu.error})")
        elif _gpu_fields(now_gpu.data) != _gpu_fields(gpu_snap):
            out.append("; ".join(rules.gpu_changes(gpu_snap.get("gpus", []), now_gpu.data.get("gpus", [])))
                       or "the GPUs' power limits differ from before the take-down")
    return out


def _gpu_fields(snapshot: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    """The GPU fields a window may change and must put back: each board's power limit, by UUID."""
    return sorted((g.get("uuid"), g.get("power_limit_w")) for g in snapshot.get("gpus", []))
