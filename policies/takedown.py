"""The generic opening of every window: preflight (fixtures, snapshots, the incumbent's identity, its
recipe bytes retained, every change previewed), the steady state before, then the take-down (quiesce,
drain, the incumbent unloaded). What runs between the take-down and the restore is the plan's method
(`policies.methods`)."""

from __future__ import annotations

from typing import Any

from flare_diag.events.answers import FixturesWork, Preview, RecipeKept, SteadyState, read
from flare_diag.events.schema import TraceOrderFrozen
from flare_diag.policies import rules, steady
from flare_diag.policies.core import WindowCore
from flare_diag.policies.drain import drain
from flare_diag.policies.driver import Proc
from flare_diag.policies.plan import expected_identity, trace_arm_order


def experiment(w: WindowCore) -> Proc:
    """The window's experiment: the take-down, the plan's method, then every cell it left open closed."""
    yield from preflight(w)
    yield from take_down(w)
    yield from w.method.run(w)
    w.close_open_cells("completed")


def preflight(w: WindowCore) -> Proc:
    """Everything read before anything changes; any of it failing aborts with nothing taken down."""
    plan = w.plan
    res = yield from w.act("validate_fixtures", {"fixtures": [f.name for f in plan.fixtures]})
    if not res.ok:
        w.fail_inside(res, "fixture validation failed")
    w.fixtures_known(read(FixturesWork, res).fixtures)
    if plan.trace is not None:
        w.emit(TraceOrderFrozen(order=[pid for pid, *_ in trace_arm_order(plan.trace)]))
    what = ("incumbent", "router", "monitoring", "gpu", "configuration")
    snaps = yield from w.act_all([("snapshot", {"what": s}) for s in what])
    for s, r in zip(what, snaps):
        if r.ok:
            w.snapshot_taken(s, r.data)
        elif r.error == "not_applicable":
            w.snapshot_taken(s, None)
        else:
            w.fail_inside(r, f"{s} snapshot failed")
    inc = w.state.snapshots["incumbent"] or {}
    w.incumbent_found()
    # a load or unload someone else started: what the manager shows loaded may be on its way out, and a
    # window that took it for the incumbent could restore the wrong recipe; its identity is in flux too
    if inc.get("busy"):
        w.abort_inside("preflight", f"the manager reports a load or unload in progress (busy) with {inc.get('recipe')!r} "
                                     f"loaded: the incumbent is not settled; try again once the manager is idle")
    mism = rules.identity_mismatches(expected_identity(plan), inc.get("identity", {}))
    if inc.get("identity", {}).get("recipe_sha256") not in (None, inc.get("sha256")):
        mism.append("incumbent serving recipe_sha256 differs from the manager's loaded recipe")
    if mism:
        w.abort_inside("identity_drift", "incumbent identity before take-down: " + "; ".join(mism))
    # The window's incumbent is what the manager has loaded, so a candidate left loaded by an
    # earlier window that failed would be taken for it, and its restore would put the candidate back.
    if inc.get("recipe") and inc.get("recipe") == w.candidate_recipe:
        w.abort_inside("preflight", f"the loaded recipe {inc.get('recipe')!r} is the plan's candidate, not an incumbent: "
                                     f"an earlier window may have left it loaded; restore the incumbent first")
    if w.expected_incumbent and inc.get("sha256") != w.expected_incumbent:
        w.abort_inside("preflight", f"the loaded recipe (sha256 {str(inc.get('sha256'))[:12]}) is not the incumbent "
                                     f"{w.expected_incumbent[:12]} an earlier window that did not restore recorded; "
                                     f"restore it first")
    yield from retain_and_preview(w, inc)


def retain_and_preview(w: WindowCore, inc: dict[str, Any]) -> Proc:
    """The recipes' exact bytes retained, and every change the window may make (the rollback too) previewed."""
    # The seed: retain exact recipe bytes before taking the incumbent down. Every load, unload
    # and the restore from here on name the hash of the bytes retained here (contract section 1
    # gives no other source of a recipe's hash).
    kept = yield from w.act_all([
        ("retain_recipe", {"recipe": inc.get("recipe"), "expect_sha256": inc.get("sha256"), "role": "incumbent"}),
        ("retain_recipe", {"recipe": w.candidate_recipe, "role": "candidate"}),
    ])
    for role, r in zip(("incumbent", "candidate"), kept):
        if not r.ok:
            w.fail_inside(r, f"{role} recipe bytes could not be retained")
    w.candidate_kept(read(RecipeKept, kept[1]).sha256)
    # Rollback is previewed too: the incumbent's own load is what the restore will ask for.
    previews = yield from w.act_all([
        ("preview", {"op": "unload", "recipe": inc.get("recipe"), "sha256": inc.get("sha256"), "role": "incumbent"}),
        ("preview", {"op": "load", "recipe": w.candidate_recipe, "sha256": w.state.candidate_sha, "role": "candidate"}),
        ("preview", {"op": "load", "recipe": inc.get("recipe"), "sha256": inc.get("sha256"), "role": "rollback"}),
    ])
    for r in previews:
        if not r.ok or read(Preview, r).ok is not True:
            w.fail_inside(r, "preview refused")


def take_down(w: WindowCore) -> Proc:
    """The steady state checked, the primary quiesced (minute 0) and drained, the incumbent unloaded."""
    plan = w.plan
    inc = w.state.snapshots["incumbent"] or {}
    yield from steady_state_before(w)
    w.taking_down()
    res = yield from w.act("quiesce", {})
    if not res.ok and res.error != "not_applicable":
        w.fail_inside(res, "quiesce failed")
    w.quiesced_now()
    drained = yield from drain(w, plan.timing.quiesce_drain_timeout_s, "quiesce",
                               router=w.state.snapshots.get("router") is not None)
    if not drained.settled:
        w.abort_inside("containment", f"the primary did not drain within {w.drain_timeout_s(plan.timing.quiesce_drain_timeout_s):g} s "
                                       f"of quiesce{drained.unanswered_words()}")
    res = yield from w.act("unload", {"recipe": inc.get("recipe"), "sha256": inc.get("sha256")})
    if not res.ok:
        # the take-down itself failed: no candidate can load beside the incumbent, so restore
        w.abort_inside(rules.abort_for_error(res.error) or "preflight",
                        f"incumbent unload failed, nothing was taken down: {res.detail or res.error}")


def steady_state_before(w: WindowCore) -> Proc:
    """The steady-state guards once, before anything changes: a pool already unhealthy is not one to
    take a primary out of (Chaos Toolkit's hypothesis before the method). A guard the evaluation could
    not answer does not stop the window here; the guard watch's silence bound does, if it lasts."""
    if not w.steady_state or not w.plan.guards:
        return
    res = yield from w.act("steady_state", {"when": "before", "queries": {g.name: g.query for g in w.plan.guards}})
    if not res.ok:
        return
    said = read(SteadyState, res).guards
    for g in w.enforced_guards("experiment"):
        value = steady.worst(g, said[g.name].values if g.name in said else [])
        if value is not None and steady.breached(g, value):
            w.abort_inside("steady_state", f"before the quiesce the pool is already unhealthy: guard {g.name}: "
                                            f"{value:.6g} {g.breach_if} {g.threshold:g} ({g.query}); nothing was changed")
