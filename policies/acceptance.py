"""The follow-on acceptance rule: correctness, three matched repeats, >=5% benefit, <=3% regression."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec

# the seed's bar: a follow-on plan may set a stricter one (`[follow_on]`), never a looser one
MIN_BENEFIT = 0.05
MAX_REGRESSION = 0.03


def percent(x: float) -> str:
    """0.05 -> '5%', 0.075 -> '7.5%': a bar as it was set, not rounded to another."""
    return f"{x * 100:g}%"


def acceptance_bar(plan: dict[str, Any]) -> dict[str, float]:
    """The bar a plan (as builtins) sets in its `[follow_on]` table: the seed's where it sets none, and
    never a looser one (a plan checked before the bar was bounded may hold one)."""
    fo = plan.get("follow_on") or {}
    return {"min_benefit": max(float(fo.get("min_benefit", MIN_BENEFIT)), MIN_BENEFIT),
            "max_regression": min(float(fo.get("max_regression", MAX_REGRESSION)), MAX_REGRESSION)}


class Run(msgspec.Struct, frozen=True):
    """One repeat: its fixture bytes' hash, correctness, primary metric and protected metrics (lower is better)."""

    fixture_sha256: str
    correct: bool
    primary: float
    protected: dict[str, float] = {}
    incorrect: str = ""  # when not correct: which check failed, as the report says it


class Acceptance(msgspec.Struct, frozen=True):
    accepted: bool
    reason: str
    primary_benefit: float | None = None
    worst_regression: float | None = None
    min_benefit: float = MIN_BENEFIT  # the bar it was judged against
    max_regression: float = MAX_REGRESSION


def accept(candidate: Sequence[Run], baseline: Sequence[Run], *, repeats: int = 3,
           min_benefit: float = MIN_BENEFIT, max_regression: float = MAX_REGRESSION) -> Acceptance:
    bar = {"min_benefit": min_benefit, "max_regression": max_regression}
    if len(candidate) < repeats or len(baseline) < repeats:
        return Acceptance(False, f"not accepted: {len(candidate)} candidate and {len(baseline)} baseline repeats, need {repeats} matched", **bar)
    fixtures = {r.fixture_sha256 for r in (*candidate, *baseline)}
    if len(fixtures) != 1:
        return Acceptance(False, "not accepted: repeats were not run on the same fixture bytes", **bar)
    if not all(math.isfinite(r.primary) for r in (*candidate, *baseline)):
        return Acceptance(False, "not accepted: the primary metric was not measured in every repeat", **bar)
    wrong = [r for r in candidate if not r.correct]
    if wrong:
        why = "; ".join(dict.fromkeys(r.incorrect for r in wrong if r.incorrect))
        return Acceptance(False, "not accepted: the candidate failed independent correctness" + (f" ({why})" if why else ""), **bar)
    c = sum(r.primary for r in candidate) / len(candidate)
    b = sum(r.primary for r in baseline) / len(baseline)
    if b <= 0:
        return Acceptance(False, "not accepted: baseline primary metric is not positive", **bar)
    benefit = (b - c) / b
    worst, worst_name = 0.0, ""
    for name in baseline[0].protected:
        bc = sum(r.protected.get(name, math.inf) for r in candidate) / len(candidate)
        bb = sum(r.protected.get(name, 0.0) for r in baseline) / len(baseline)
        if not math.isfinite(bc):
            return Acceptance(False, f"not accepted: protected {name} was not measured in every candidate repeat", benefit, **bar)
        if bb > 0 and (bc - bb) / bb > worst:
            worst, worst_name = (bc - bb) / bb, name
    if benefit < min_benefit:
        return Acceptance(False, f"not accepted: primary benefit {benefit:.1%} is below {percent(min_benefit)}", benefit, worst, **bar)
    if worst > max_regression:
        return Acceptance(False, f"not accepted: protected {worst_name} regressed {worst:.1%}, above {percent(max_regression)}", benefit, worst, **bar)
    return Acceptance(True, f"accepted: primary benefit {benefit:.1%} (at least {percent(min_benefit)}), worst protected "
                            f"regression {worst:.1%} (at most {percent(max_regression)})", benefit, worst, **bar)
