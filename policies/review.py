"""Reviews of a plan's exact bytes: whether the reviews on record let a production plan run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec


class Review(msgspec.Struct):
    """One recorded review, as a log holds it (`review_signed`), with where it is in that log."""

    plan_sha256: str
    fixtures: dict[str, str]
    by: str
    note: str = ""
    seq: int = 0
    hash: str = ""
    subject: str = "plan"
    source_window: str = ""
    policy: str = ""


def _person(name: str) -> str:
    return " ".join(name.split()).casefold()


def accepting(reviews: Sequence[Review], plan_sha256: str, fixtures: Mapping[str, str], author: str) -> tuple[Review | None, str]:
    """The latest review of exactly these bytes by someone other than `author`, or (None, why not)."""
    same = [r for r in reviews if r.subject == "plan" and r.plan_sha256 == plan_sha256 and r.fixtures == dict(fixtures)]
    if not same:
        near = [r for r in reviews if r.subject == "plan" and r.plan_sha256 == plan_sha256]
        if near:
            return None, (f"the recorded reviews of this plan's bytes cover other fixture manifests "
                          f"({', '.join(sorted(near[-1].fixtures))}); these bytes were never reviewed")
        return None, f"no review of these exact bytes (plan sha256 {plan_sha256[:12]}) is recorded"
    others = [r for r in same if _person(r.by) != _person(author)]
    if not others:
        return None, f"the only reviews of these bytes are by the plan's author ({author}); someone else must review it"
    return others[-1], ""


def follow_on_review(reviews: Sequence[Review], window: str, policy: str, author: str) -> tuple[Review | None, str]:
    """The latest review of a follow-on from `window` with `policy`, by someone other than the source plan's
    `author`, or (None, why not): the seed asks for one before any policy change."""
    same = [r for r in reviews if r.subject == "follow_on" and r.source_window == window and r.policy == policy]
    if not same:
        return None, (f"no review of a follow-on of window {window} with {policy} is recorded "
                      f"(`flare-diag review sign {window} --policy {policy} --by NAME --note ... --log LOG`)")
    others = [r for r in same if _person(r.by) != _person(author)]
    if not others:
        return None, f"the only reviews of this follow-on are by the source plan's author ({author})"
    return others[-1], ""
