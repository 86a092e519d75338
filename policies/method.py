"""The shape of a method: what a plan's `method` names runs between the take-down and the restore.

The generic rules (policies/window.py, core.py, takedown.py, restore.py: the abort rules, the
watches, the stop minute, the restore reservation, the cells ledger) hold for every method. The
plan declares the phases (grouped into arms by incarnation, policies/planner.arms: the cells a
window owes, forecast and report); a method says how they run and what its cells mean. A new
method is a new module in policies/methods/ (docs/adapters.md, "A method", walks through one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flare_diag.policies.plan import Plan
from flare_diag.policies.verdicts import Cells, judged

if TYPE_CHECKING:
    from flare_diag.policies.core import WindowCore
    from flare_diag.policies.driver import Proc


def no_findings(cells: Cells) -> list[str]:
    return []


@dataclass(frozen=True)
class Method:
    """One method: its name in a plan, and the three things only it knows."""

    name: str
    summary: str  # one line: what the method finds out
    # after the take-down, with the incumbent unloaded: the method's phases, each cell recorded
    # through WindowCore.record_cell; it returns when it has nothing more to run
    run: Callable[[WindowCore], Proc]
    # the method's rule over its cells: (hypothesis, basis, next experiment); the rules every
    # verdict keeps (policies/verdicts.py) are applied around it
    rule: Callable[[Plan, Cells], tuple[str, str, str]]
    findings: Callable[[Cells], list[str]] = no_findings

    def verdict(self, plan: Plan, cells: Cells, required: list[str], no_cause: str | None) -> tuple[str, str, str]:
        return judged(lambda c: self.rule(plan, c), cells, required, no_cause)
