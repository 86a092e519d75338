"""`flare-diag plan follow-on`: the second window's plan, written only from a window that earns it.

`--policy NAME`: from a `row_checkpoint_churn` window that the reproducer reproduces, and a policy
that reuses more than the incumbent's in the model on that window's own requests. The plan is the
source window's own (same fixtures, bytes, sampling, identity) with a `[follow_on]` table: the gates'
evidence, and the windows to run, baseline and candidate interleaved ABBA (each side sits early and
late alike, so a drift that is linear in time weighs on both equally), judged by `report compare`
with the acceptance rule.

`--stage nsight`: from a window whose cache effects are understood (a verdict other than
`inconclusive`) and whose trace overhead is understood by its plan's bounds. The daemon never runs a
capture itself; the plan records the admission and its evidence for the stage that does.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from flare_diag.daemon.reports.publish import build_report
from flare_diag.daemon.reproducer.reproduce import ReproduceError, choose_window, reproduce_window
from flare_diag.daemon.simulator import Scenario
from flare_diag.events.reader import LogReader
from flare_diag.events.schema import WindowOpened
from flare_diag.policies.plan import FollowOn, Plan, plan_from_builtins


class Refused(ValueError):
    """A gate the source window does not pass (one line: which, and why)."""


def abba(repeats: int) -> list[str]:
    order: list[str] = []
    for i in range(repeats):
        order += ["baseline", "candidate"] if i % 2 == 0 else ["candidate", "baseline"]
    return order


def source_log(path: Path) -> Path:
    """A log.db, an out folder holding one, or a report.json beside one."""
    if path.is_dir():
        path = path / "log.db"
    elif path.suffix == ".json":
        path = path.parent / "log.db"
    if not path.is_file():
        raise Refused(f"{path}: no event log there (give the window's log.db, its out folder, or a report.json beside it)")
    return path


def _opened(db: Path, window: str) -> WindowOpened:
    with LogReader(db) as r:
        ev = next((e.event() for e in r.iter_for_projection(window, {"window_opened"})), None)
    if not isinstance(ev, WindowOpened):
        raise Refused(f"{db}: window {window} has no opening event")
    return ev


def follow_on(db: Path, window: str | None, sc: Scenario, policy: str | None, stage: str, repeats: int,
              force: bool) -> Plan:
    try:
        with LogReader(db) as r:
            window = choose_window(r, db, window)
    except ReproduceError as exc:
        raise Refused(str(exc)) from None
    report = build_report(db, window)
    it = report["integrity"]
    if not (it["chain_ok"] and it["audit_ok"]):
        raise Refused(f"{db}: the log does not verify; no follow-on is derived from it")
    opened = _opened(db, window)
    verdict = (report.get("verdict") or {}).get("hypothesis") or "none"
    source = plan_from_builtins(opened.plan, "the source window's plan")
    missed: list[str] = []
    if stage == "nsight":
        tr = report.get("trace") or {}
        if verdict == "inconclusive" or verdict == "none":
            missed.append(f"the cache effects are not understood (verdict {verdict})")
        if not tr.get("overhead_understood"):
            why = "; ".join(f"C{o['concurrency']}: {o['why']}" for o in tr.get("overhead", []) if not o["understood"])
            missed.append("the trace overhead is not understood (" + (why or "no trace pairs measured") + ")")
        fo = FollowOn("nsight", window, opened.plan_sha256, verdict,
                      trace_overhead="; ".join(f"C{o['concurrency']} {o.get('relative', 0):+.1%}" for o in tr.get("overhead", [])))
    else:
        if not policy:
            raise Refused("plan follow-on: give --policy NAME (or --stage nsight)")
        if verdict != "row_checkpoint_churn":
            missed.append(f"the source window's verdict is {verdict}, not row_checkpoint_churn")
        try:
            rep = reproduce_window(db, window, sc, [sc.eviction, policy])
        except ReproduceError as exc:
            raise Refused(f"the reproducer cannot run on the source window: {exc}") from None
        reuse = {p.policy: p.reused_tokens for p in rep.policies}
        if not rep.reproduces:
            missed.append(f"the reproducer does not reproduce the source window ({rep.agreed} of {rep.compared} "
                          f"requests agree on scenario {sc.name})")
        if policy not in reuse:
            raise Refused(f"--policy {policy}: the model knows no such policy")
        if reuse[policy] <= reuse[sc.eviction]:
            missed.append(f"{policy} reuses {reuse[policy]:,} host tokens in the model on the window's requests, "
                          f"no more than the incumbent's {sc.eviction} ({reuse[sc.eviction]:,})")
        fo = FollowOn("policy", window, opened.plan_sha256, verdict, policy=policy, baseline_policy=sc.eviction,
                      reproducer=f"{rep.agreed} of {rep.compared} requests agree (scenario {sc.name})",
                      model_reused_tokens=reuse, order=abba(repeats), repeats=repeats)  # type: ignore[arg-type]
    if missed and not force:
        raise Refused("plan follow-on refused: " + "; ".join(missed))
    if missed:
        fo = msgspec.structs.replace(fo, forced=True, override="; ".join(missed))
    suffix = "nsight" if stage == "nsight" else f"policy-{policy}"
    conditional = source.conditional
    if stage == "nsight":
        conditional = [msgspec.structs.replace(c, admission=f"admitted by follow-on from window {window}"
                                               + (" (forced)" if fo.forced else ""))
                       if c.id == "nsight_capture" else c for c in conditional]
    return msgspec.structs.replace(source, name=f"{source.name}-follow-on-{suffix}"[:120], follow_on=fo,
                                   conditional=conditional,
                                   description=(f"follow-on of window {window} ({verdict}); "
                                                + (f"{policy} against {sc.eviction}, {repeats} matched repeats a side, "
                                                   f"ABBA; accepted by `report compare` (>= 5 % benefit, <= 3 % "
                                                   f"regression, correct)" if stage == "policy" else
                                                   "the capture stage admitted on its evidence")))


def _without_none(node):
    """TOML has no null: a field left unset is left out, as a hand-written plan leaves it."""
    if isinstance(node, dict):
        return {k: _without_none(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_without_none(v) for v in node]
    return node


def write_plan(plan: Plan, out: Path) -> str:
    data = msgspec.toml.encode(_without_none(msgspec.to_builtins(plan)))
    out.write_bytes(data)
    return hashlib.sha256(data).hexdigest()
