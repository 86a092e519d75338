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
from flare_diag.daemon.reports.report_view import integrity_problem
from flare_diag.events.schema import WindowOpened
from flare_diag.daemon.hosts.fixture import (Fixture, FixtureError, find_fixture, greedy_variant, load_fixture,
                                              write_fixture)
from flare_diag.daemon.window.setup import fixture_digest
from flare_diag.daemon.window.reviews import ReviewError, reviews_in
from flare_diag.policies.review import follow_on_review
from flare_diag.policies.plan import FixtureRef, FollowOn, PhaseSpec, Plan, plan_from_builtins


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
              force: bool, reviews: Path | None = None) -> Plan:
    """The follow-on plan a source window earns. `reviews`: the log holding the follow-on's review (default:
    the source log itself)."""
    try:
        with LogReader(db) as r:
            window = choose_window(r, db, window)
    except ReproduceError as exc:
        raise Refused(str(exc)) from None
    report = build_report(db, window)
    it = report["integrity"]
    if not (it["chain_ok"] and it["audit_ok"]):
        why = ("the log does not verify" if integrity_problem(it) else
               f"the window's decisions were not audited by this build ({it.get('audit_policy')})")
        raise Refused(f"{db}: {why}; no follow-on is derived from it")
    opened = _opened(db, window)
    verdict = (report.get("verdict") or {}).get("hypothesis") or "none"
    source = plan_from_builtins(opened.plan, "the source window's plan")
    review = _unforceable_gates(report, window, "nsight" if stage == "nsight" else policy, reviews or db, source.author)
    if stage == "nsight":
        fo, missed = _nsight_earned(report, window, opened, verdict)
    else:
        if not policy:
            raise Refused("plan follow-on: give --policy NAME (or --stage nsight)")
        fo, missed = _policy_earned(db, window, opened, verdict, sc, policy, repeats)
        greedy = _greedy_fixture(source, opened)
    fo = msgspec.structs.replace(fo, review=f"{review.by} (seq {review.seq} of {reviews or db})"
                                 + (f": {review.note}" if review.note else ""))
    if missed and not force:
        raise Refused("plan follow-on refused: " + "; ".join(missed))
    if missed:
        fo = msgspec.structs.replace(fo, forced=True, override="; ".join(missed))
    suffix = "nsight" if stage == "nsight" else f"policy-{policy}"
    conditional = source.conditional
    if stage == "policy":
        source = _with_consistency(source, greedy)
        fo = msgspec.structs.replace(fo, consistency_fixture=greedy.name)
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


def _nsight_earned(report: dict, window: str, opened: WindowOpened, verdict: str) -> tuple[FollowOn, list[str]]:
    """The capture stage's follow-on, and what the source window has not shown that it needs."""
    tr = report.get("trace") or {}
    missed = []
    if verdict == "inconclusive" or verdict == "none":
        missed.append(f"the cache effects are not understood (verdict {verdict})")
    if not tr.get("overhead_understood"):
        why = "; ".join(f"C{o['concurrency']}: {o['why']}" for o in tr.get("overhead", []) if not o["understood"])
        missed.append("the trace overhead is not understood (" + (why or "no trace pairs measured") + ")")
    return FollowOn("nsight", window, opened.plan_sha256, verdict,
                    trace_overhead="; ".join(f"C{o['concurrency']} {o.get('relative', 0):+.1%}" for o in tr.get("overhead", []))), missed


def _policy_earned(db: Path, window: str, opened: WindowOpened, verdict: str, sc: Scenario, policy: str,
                   repeats: int) -> tuple[FollowOn, list[str]]:
    """A policy's follow-on (the reproducer's model of it on the window's requests), and what the source
    window has not shown that it needs."""
    missed = []
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
    return FollowOn("policy", window, opened.plan_sha256, verdict, policy=policy, baseline_policy=sc.eviction,
                    reproducer=f"{rep.agreed} of {rep.compared} requests agree (scenario {sc.name})",
                    model_reused_tokens=reuse, order=abba(repeats), repeats=repeats), missed  # type: ignore[arg-type]  # abba gives the sides as the Literal strings the field takes


def _unforceable_gates(report: dict, window: str, change: str | None, reviews: Path, author: str):
    """The gates --force never passes: the source window ended with its restoration verified, and a review
    of this follow-on (the window, the policy change) by someone other than the source plan's author is
    recorded in `reviews`. Returns that review; Refused otherwise."""
    restored = report.get("restoration") or {}
    if report.get("outcome") == "restore_failed" or not restored.get("verified"):
        # a window that left its primary unrestored earns no second one
        raise Refused(f"window {window} ended {report.get('outcome')} without a verified restoration; no follow-on is "
                      f"derived from it (restore the primary and repeat the window first)")
    if not change:
        raise Refused("plan follow-on: give --policy NAME (or --stage nsight)")
    try:
        review, why = follow_on_review(reviews_in(reviews), window, change, author)
    except ReviewError as exc:
        raise Refused(f"--reviews {exc}") from None
    if review is None:
        raise Refused(f"plan follow-on refused: {why} (--force does not skip the review)")
    return review


CONSISTENCY_MAX_TOKENS = 256  # greedy answers long enough to differ, short enough to cost minutes


def _greedy_fixture(source: Plan, opened: WindowOpened) -> Fixture:
    """The greedy variant of the fixture the source window's comparable replays read, derived from the
    exact bytes that window replayed (refused when the fixture changed since)."""
    name = next((ph.fixture for ph in source.phases if ph.kind == "replay" and ph.comparable and ph.fixture), None)
    if name is None:
        raise Refused("the source window's plan has no comparable replay phase to derive a consistency fixture from")
    try:
        fx = load_fixture(find_fixture(name, [Path(d) for d in opened.fixture_dirs]))
    except FixtureError as exc:
        raise Refused(f"the source window's fixture {name}: {exc}") from None
    if opened.fixtures_sha256.get(name) not in (None, fixture_digest(fx)):
        raise Refused(f"fixture {name} changed since window {opened.window_id} replayed it; a follow-on is derived from "
                      f"the bytes the window replayed")
    try:
        return greedy_variant(fx, f"{name}-greedy", CONSISTENCY_MAX_TOKENS)
    except FixtureError as exc:
        raise Refused(str(exc)) from None


def _with_consistency(plan: Plan, greedy: Fixture) -> Plan:
    """The plan with an output-consistency phase on a fresh incarnation of its own, after every other
    phase: the greedy bodies cold on an empty host cache, then again with its reuse. The optional,
    non-comparable phases and the trace arms, which the acceptance rule does not read, give it their
    minutes (the source plan's required cells and the consistency phase do not fit 70 minutes together)."""
    label = next(c for c in "GHIJKLMNOPQRSTUVWXYZ" if all(ph.incarnation != c for ph in plan.phases))
    kept = [ph for ph in plan.phases if not (ph.optional and not ph.comparable)]
    phases = [*kept,
              PhaseSpec(id=f"{label}.identity", incarnation=label, kind="identity", fresh=True),
              PhaseSpec(id=f"{label}.output_consistency", incarnation=label, kind="consistency", fixture=greedy.name,
                        comparable=False)]
    ref = FixtureRef(greedy.name, max_tokens=int(greedy.sampling["max_tokens"]), temperature=0.0)
    used = {ph.fixture for ph in phases if ph.fixture}
    fixtures = [f for f in plan.fixtures if f.name in used]
    return msgspec.structs.replace(plan, fixtures=[*fixtures, ref], phases=phases, trace=None)


def write_consistency_fixture(plan: Plan, opened_db: Path, out: Path) -> Path | None:
    """Writes the plan's greedy fixture beside the plan file (`out`'s folder), where `run --plan`
    looks for fixtures; None for a plan without one."""
    fo = plan.follow_on
    if fo is None or not fo.consistency_fixture:
        return None
    opened = _opened(opened_db, fo.source_window)
    greedy = _greedy_fixture(plan_from_builtins(opened.plan, "the source window's plan"), opened)
    src = next(ph.fixture for ph in plan.phases if ph.kind == "replay" and ph.comparable and ph.fixture)
    try:
        return write_fixture(out.parent, greedy, {"fixture": src, "window": fo.source_window,
                                                  "digest": opened.fixtures_sha256.get(src or "", "")})
    except FixtureError as exc:
        raise Refused(str(exc)) from None


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
