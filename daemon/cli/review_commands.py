"""`flare-diag review sign|list PLAN`: recorded reviews of a plan's exact bytes and its fixtures' manifests."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from flare_diag.daemon.cli.common import EXIT_OK, UsageError

if TYPE_CHECKING:
    from flare_diag.policies.plan import Plan


def add_parser(sub, parser_class) -> None:
    rv = sub.add_parser("review", help="record and list reviews of a plan's exact bytes (a production plan needs one "
                                       "by someone other than its author before `run` or `start`)")
    rsub = rv.add_subparsers(dest="review_cmd", required=True, parser_class=parser_class)
    sg = rsub.add_parser("sign", help="record your review of PLAN's bytes and every fixture's manifest")
    sg.add_argument("plan", type=Path, metavar="PLAN|WINDOW",
                    help="the plan (TOML) you reviewed; or, with --policy, the source window of a follow-on you reviewed")
    sg.add_argument("--policy", default=None,
                    help="a follow-on's review: the policy change (the candidate eviction policy, or nsight) of a "
                         "follow-on from WINDOW, with the source window's evidence (`plan follow-on` needs one)")
    sg.add_argument("--by", required=True, help="who reviewed it (not the plan's author, for it to count)")
    sg.add_argument("--note", default="", help="what the review found or checked")
    sg.add_argument("--export", action="store_true", help="also write PLAN.review-BY.json beside the plan")
    ls = rsub.add_parser("list", help="who reviewed which bytes of PLAN, and whether a review lets it run now")
    ls.add_argument("plan", type=Path, help="the plan (TOML)")
    ls.add_argument("--json", action="store_true", help="one JSON object")
    for p in (sg, ls):
        p.add_argument("--log", type=Path, default=None,
                       help="a review log for foreground `run`s (created if missing); without it: the daemon's log, "
                            "over its socket")
        p.add_argument("--socket", type=Path, default=None,
                       help="the daemon's control socket (default: $FLARE_DIAG_SOCKET, else /run/flare-diagd/control.sock)")


def _subject(plan_path: Path) -> tuple[bytes, Plan, dict[str, str]]:
    from flare_diag.daemon.window.setup import InputError, load_fixtures, read_plan
    try:
        raw, plan = read_plan(plan_path)
        fixtures = load_fixtures(plan, [plan_path.parent.resolve()])
    except InputError as exc:
        raise UsageError(str(exc)) from None
    from flare_diag.daemon.window.reviews import subject
    _sha, manifests = subject(raw, fixtures)
    return raw, plan, manifests


def _sign_follow_on(args: argparse.Namespace) -> int:
    """A review of a follow-on: its source window, its policy change and the evidence, as the seed asks."""
    from flare_diag.events.schema import ReviewSigned
    window = str(args.plan)
    if not window or "/" in window or len(window) > 200:
        raise UsageError(f"{window[:80]!r}: with --policy, expected the source window's id")
    if args.log is None:
        raise UsageError("review sign WINDOW --policy P: give --log, the log that holds the window (or the one "
                         "`plan follow-on --reviews` will read)")
    ev = ReviewSigned(subject="follow_on", plan_name="", plan_sha256="", author="", fixtures={}, by=" ".join(args.by.split()),
                      note=args.note, source_window=window, policy=args.policy)
    seq, _h, where = _record(args, ev)
    print(f"review of a follow-on of window {window} with {args.policy} by {ev.by} recorded in {where} at seq {seq}")
    return EXIT_OK


def run_review(args: argparse.Namespace) -> int:
    import hashlib
    if args.review_cmd == "sign":
        if not " ".join(args.by.split()):
            raise UsageError("--by: expected the reviewer's name")
        if len(args.by) > 200 or len(args.note) > 4000:
            raise UsageError("--by is at most 200 characters and --note at most 4000")
        if args.policy is not None:
            return _sign_follow_on(args)
    raw, plan, manifests = _subject(args.plan)
    sha = hashlib.sha256(raw).hexdigest()
    if args.review_cmd == "sign":
        from flare_diag.events.schema import ReviewSigned
        ev = ReviewSigned(subject="plan", plan_name=plan.name, plan_sha256=sha, author=plan.author,
                          fixtures=manifests, by=" ".join(args.by.split()), note=args.note)
        seq, h, where = _record(args, ev)
        self_review = ev.by.casefold() == " ".join(plan.author.split()).casefold()
        print(f"review of {args.plan} (sha256 {sha[:12]}) by {ev.by} recorded in {where} at seq {seq}"
              + (" - it is the plan's author's, so it does not let the plan run" if self_review else ""))
        if args.export:
            import msgspec
            from flare_diag.daemon.window.reviews import export
            print(f"exported: {export(args.plan, msgspec.to_builtins(ev), seq, h, where)}")
        return EXIT_OK
    reviews, where = _reviews(args)
    from flare_diag.policies.review import accepting
    ok, why = accepting(reviews, sha, manifests, plan.author)
    rows = [{"by": r.by, "note": r.note, "seq": r.seq, "these_bytes": r.plan_sha256 == sha and r.fixtures == manifests,
             "plan_sha256": r.plan_sha256} for r in reviews if r.subject == "plan"]
    if args.json:
        print(json.dumps({"plan_sha256": sha, "author": plan.author, "reviews": rows,
                          "may_run": ok is not None, "why_not": why}))
        return EXIT_OK
    print(f"{args.plan}: sha256 {sha[:12]}, author {plan.author or '(none)'}; reviews in {where}:")
    for r in rows:
        print(f"  seq {r['seq']}: {r['by']}{' - these bytes' if r['these_bytes'] else ' - other bytes ' + r['plan_sha256'][:12]}"
              + (f": {r['note']}" if r["note"] else ""))
    print("may run: yes, reviewed by " + ok.by if ok is not None else f"may run: no: {why}")
    return EXIT_OK


def _record(args: argparse.Namespace, ev) -> tuple[int, str, str]:
    if args.log is not None:
        import anyio
        from flare_diag.events.store import EventStore

        async def append() -> tuple[int, str]:
            store = await EventStore.open(args.log)
            try:
                env = await store.append(ev)
            finally:
                await store.close()
            return env.seq, env.hash.hex()
        seq, h = anyio.run(append)
        return seq, h, str(args.log)
    from flare_diag.daemon.cli import client
    from flare_diag.daemon.service import control
    rep = client.call(client.socket_path(args.socket), control.ReviewSign(
        plan_name=ev.plan_name, plan_sha256=ev.plan_sha256, author=ev.author, fixtures=ev.fixtures, by=ev.by,
        note=ev.note))
    return rep["seq"], rep["hash"], "the daemon's log"


def _reviews(args: argparse.Namespace):
    from flare_diag.daemon.window.reviews import ReviewError, reviews_in
    if args.log is not None:
        try:
            return reviews_in(args.log), str(args.log)
        except ReviewError as exc:
            raise UsageError(str(exc)) from None
    from flare_diag.daemon.cli import client
    from flare_diag.daemon.service import control
    from flare_diag.policies.review import Review
    rep = client.call(client.socket_path(args.socket), control.ReviewList())
    return [Review(**r) for r in rep["reviews"]], "the daemon's log"
