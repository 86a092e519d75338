"""The rules every method's verdict keeps: no cause named after an abort that forbids one, and every
required cell that was not measured named in the basis (contract 4, amended 2026-12-03)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Cells = Mapping[str, Mapping[str, Any]]
# a method's rule over the cells alone: (hypothesis, basis, next experiment)
Rule = Callable[[Cells], tuple[str, str, str]]

INCONCLUSIVE = "inconclusive"

# the aborts after which no cause may be named, whatever a method's rule would say: why, and what to do next
NO_CAUSE = {
    "engine_restart": ("the engine restarted unseen during the window, so its counters and caches may have been "
                       "emptied under any phase", "Find why the engine restarted (the supervisor's journal, the engine's "
                       "own log, OOM kills) and repeat the window once it stays up; nothing measured here names a cause."),
    "rejected": ("the host refused the plan's bodies", "Make the bodies acceptable to this engine (its request schema, "
                 "the plan's [sampling]) or the engine's version the bodies were written for, then repeat the window."),
    "not_as_sent": ("the host did not serve the plan's bodies as the window sent them (answers beyond their "
                    "max_tokens, an exact body counted at another prompt size than before, or answers its engine's "
                    "counters do not account for: an earlier answer's completion id again, fewer requests finished "
                    "or tokens generated than answered)", "Find what changes, ignores or answers the bodies before the engine (a gateway "
                    "that stamps prompts, rewrites max_tokens or answers from a response cache, an engine that reads "
                    "another field) or which engine the site's metrics come from, point the site past it or at the "
                    "engine that serves, then repeat the window."),
    "unexpected_input": ("the decider received an observation it has no rule for, so the state its cells were "
                         "judged from cannot be trusted", "Find what produced the input (the alarm names its type: a "
                         "daemon newer than this policy, or a bug) and repeat the window on a matching build."),
}


def judged(rule: Rule, cells: Cells, required: Sequence[str] = (), no_cause: str | None = None) -> tuple[str, str, str]:
    """(hypothesis, basis, next experiment): `rule`'s, unless `no_cause` forbids naming one; the basis
    always names every required cell that was not measured."""
    if no_cause in NO_CAUSE:
        why, nxt = NO_CAUSE[no_cause]
        hyp, basis = INCONCLUSIVE, f"no cause is named: {why} (abort {no_cause})"
    else:
        hyp, basis, nxt = rule(cells)
    unmeasured = [p for p in required if (cells.get(p) or {}).get("status") != "measured"]
    if unmeasured:
        why = "; ".join(f"{p} {(cells.get(p) or {}).get('status') or 'not run'}"
                        + (f" ({cells[p].get('reason')})" if cells.get(p) and cells[p].get("reason") else "")
                        for p in unmeasured)
        basis += f". Required cells not measured: {why}"
    return hyp, basis, nxt
