"""Steady-state guards: PromQL queries on the site's Prometheus, their breach rule, and the judgment.

A guard (the plan's `[[guards]]`) watches the routed service the users meet while the primary is out:
it breaches when its value compares with its threshold as `breach_if` says, and `consecutive`
breaches in a row abort the window with `steady_state` (or, when it guards the restore, raise an
alarm: the restore goes on, since readmitting the primary is what relieves the pool). A `dry_run`
guard is evaluated and logged the same way and never aborts (Argo Rollouts' dry-run analysis).
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec
import promql_parser

Comparison = Literal[">", ">=", "<", "<="]


class Guard(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    query: str
    breach_if: Comparison  # the guard breaches when `value breach_if threshold`
    threshold: float
    consecutive: int = 2  # breaches in a row that abort
    interval_s: float = 15.0  # window seconds between evaluations
    during: Literal["experiment", "restore", "both"] = "both"
    dry_run: bool = False


class GuardError(ValueError):
    pass


def selectors(query: str) -> list[str]:
    """The series selectors a PromQL query reads (`name{label="v"}`), in order; GuardError when it
    does not parse."""
    try:
        expr = promql_parser.parse(query)
    except ValueError as exc:
        raise GuardError(str(exc)) from None
    out: list[str] = []

    def walk(node: object) -> None:
        name = type(node).__name__
        if name == "VectorSelector":
            text = node.prettify()  # type: ignore[attr-defined]  # promql_parser's nodes are an untyped extension
            if text not in out:
                out.append(text)
            return
        for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                walk(child)
        for child in getattr(node, "args", None) or []:
            walk(child)

    walk(expr)
    return out


def check_guards(guards: list[Guard], where: str) -> None:
    """PlanError-shaped checks (the caller wraps them): unique names, parsable queries, sane bounds."""
    seen: set[str] = set()
    for i, g in enumerate(guards):
        at = f"{where}: guards[{i}]"
        if not g.name or len(g.name) > 64 or not all(c.isalnum() or c in "._-" for c in g.name):
            raise GuardError(f"{at}.name = {g.name[:80]!r}: expected letters, digits, '.', '_' or '-' (at most 64)")
        if g.name in seen:
            raise GuardError(f"{at}.name = {g.name!r} is used twice")
        seen.add(g.name)
        if len(g.query) > 4096:
            raise GuardError(f"{at}.query: {len(g.query)} characters; a guard's query is at most 4096")
        try:
            sels = selectors(g.query)
        except GuardError as exc:
            raise GuardError(f"{at}.query: not valid PromQL ({exc})") from None
        if not sels:
            raise GuardError(f"{at}.query: reads no series; a guard watches something the site's Prometheus scrapes")
        if not math.isfinite(g.threshold):
            raise GuardError(f"{at}.threshold = {g.threshold}: expected a finite number")
        if not 1 <= g.consecutive <= 1000:
            raise GuardError(f"{at}.consecutive = {g.consecutive}: expected 1 to 1000")
        if not 0.1 <= g.interval_s <= 3600:
            raise GuardError(f"{at}.interval_s = {g.interval_s}: expected 0.1 to 3600 window seconds")


def worst(g: Guard, values: list[float]) -> float | None:
    """The value a guard judges: of several series, the one nearest its breach (the largest for
    `>`/`>=`, the smallest for `<`/`<=`); None when no series has a number (no data)."""
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not vals:
        return None
    return max(vals) if g.breach_if in (">", ">=") else min(vals)


def breached(g: Guard, value: float) -> bool:
    return {">": value > g.threshold, ">=": value >= g.threshold, "<": value < g.threshold,
            "<=": value <= g.threshold}[g.breach_if]


def guards_stage(g: Guard, stage: str) -> bool:
    return g.during == "both" or g.during == stage


class Tally(msgspec.Struct, frozen=True):
    """Each guard's run of consecutive breaches, as the policy sees its evaluations: a value."""

    runs: dict[str, int] = {}
    dry_run_said: frozenset[str] = frozenset()
    restore_said: frozenset[str] = frozenset()  # guards whose current run of breaches the restore has alarmed

    def observe(self, g: Guard, value: float | None) -> tuple[Tally, int]:
        """The tally after this evaluation, and the guard's run of consecutive breaches (no data: the run stands)."""
        if value is None:
            return self, self.runs.get(g.name, 0)
        run = self.runs.get(g.name, 0) + 1 if breached(g, value) else 0
        said = self.restore_said - {g.name} if run == 0 else self.restore_said
        return Tally({**self.runs, g.name: run}, self.dry_run_said, said), run

    def said(self, name: str, dry_run: bool) -> Tally:
        """The tally once a dry run's would-be abort (or a restore's alarm) has been said for this guard."""
        if dry_run:
            return Tally(self.runs, self.dry_run_said | {name}, self.restore_said)
        return Tally(self.runs, self.dry_run_said, self.restore_said | {name})


def breach_words(g: Guard, value: float, run: int) -> str:
    return (f"guard {g.name}: {value:.6g} {g.breach_if} {g.threshold:g} for {run} consecutive evaluation"
            f"{'s' if run != 1 else ''} ({g.query})")
