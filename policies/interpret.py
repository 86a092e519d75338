"""Interpretation: the verdict of contract section 4, findings, and the seed's next causal experiment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

NEXT_EXPERIMENT = {
    "not_reproduced": (
        "Fresh-incarnation forward/forward restored host tokens, so the 52-prompt zero-restore observation "
        "did not reproduce: compare the original run's starting occupancy and exact body bytes before any policy work."
    ),
    "row_checkpoint_churn": (
        "Row/checkpoint churn remains the specific hypothesis: add bounded row/page/eviction counters and run "
        "the CPU reproducer on the same bodies; do not substitute a speculative compaction policy. Follow-on "
        "policy tests need independent correctness and three matched repeats at fixed bytes (>=5% primary "
        "benefit, <=3% protected regression)."
    ),
    "key_or_checkpoint_eligibility": (
        "Reverse replay did not restore: inspect key and checkpoint eligibility first (rendered message-prefix "
        "keys, checkpoint positions against prompt lengths, which of the three checkpoints survive) before "
        "touching eviction or compaction."
    ),
    "inconclusive": (
        "A.reverse_replay was not measured, so the order probe did not run: repeat the window after the "
        "incumbent is restored, with the failed or invalid cause fixed first."
    ),
}


def _reused(cell: Mapping | None) -> int | None:
    if not cell or cell.get("status") != "measured":
        return None
    host = cell.get("host") or {}
    return host.get("reused_tokens")


RUN_B_ARM = ("Run the B arm: a fresh incarnation B, forward prime then forward replay of the same bodies, "
             "after the incumbent is restored; the replay-order control decides between churn and a result "
             "that does not reproduce.")


def verdict(cells: Mapping[str, Mapping], required: Sequence[str] = ()) -> tuple[str, str, str]:
    """(hypothesis, basis, next experiment) by contract section 4's amended rule, in its order.

    The basis always names every required cell that was not measured."""
    unmeasured = [p for p in required if (cells.get(p) or {}).get("status") != "measured"]
    hyp, basis, nxt = _rule(cells)
    if unmeasured:
        why = "; ".join(f"{p} {(cells.get(p) or {}).get('status') or 'not run'}"
                        + (f" ({cells[p].get('reason')})" if cells.get(p) and cells[p].get("reason") else "")
                        for p in unmeasured)
        basis += f". Required cells not measured: {why}"
    return hyp, basis, nxt


def _rule(cells: Mapping[str, Mapping]) -> tuple[str, str, str]:
    rev = cells.get("A.reverse_replay")
    if not rev or rev.get("status") != "measured":
        why = rev.get("reason") if rev else "not run"
        return ("inconclusive", f"A.reverse_replay was not measured ({rev.get('status') if rev else 'absent'}: {why})",
                NEXT_EXPERIMENT["inconclusive"])
    if (rev.get("host") or {}).get("reused_tokens") is None:
        return ("inconclusive", "A.reverse_replay was measured but host reused tokens are not observable on this target",
                NEXT_EXPERIMENT["inconclusive"])
    fwd_reused = _reused(cells.get("B.forward_replay"))
    if fwd_reused is not None and fwd_reused > 0:
        return ("not_reproduced", f"B.forward_replay measured with {fwd_reused} host reused tokens",
                NEXT_EXPERIMENT["not_reproduced"])
    rev_reused = _reused(rev) or 0
    small_reused = _reused(cells.get("B.small_control"))
    if rev_reused > 0 or small_reused:
        seen = (f"A.reverse_replay reused {rev_reused} host tokens" if rev_reused > 0 else
                f"B.small_control reused {small_reused} host tokens while A.reverse_replay reused 0")
        if fwd_reused is None:
            # one diagnostic pair per order is needed to nominate a cause (contract 4, amended)
            return ("inconclusive", f"{seen}, but the replay-order control B.forward_replay was not measured",
                    RUN_B_ARM)
        return "row_checkpoint_churn", f"{seen}; B.forward_replay reused 0", NEXT_EXPERIMENT["row_checkpoint_churn"]
    parts = ["A.reverse_replay reused 0 host tokens"]
    if small_reused is not None:
        parts.append("B.small_control reused 0")
    return "key_or_checkpoint_eligibility", "; ".join(parts), NEXT_EXPERIMENT["key_or_checkpoint_eligibility"]


def findings(cells: Mapping[str, Mapping]) -> list[str]:
    """Observations that separate lookup, hit, completed restore and reuse, per measured cell."""
    out = []
    for pid, c in cells.items():
        if c.get("status") != "measured" or not c.get("host"):
            continue
        h = c["host"]
        lk, hi, fe, re = (h.get(k) for k in ("lookups", "hits", "fetched_tokens", "reused_tokens"))
        if None in (lk, hi, fe, re):
            missing = [k for k in ("lookups", "hits", "fetched_tokens", "reused_tokens") if h.get(k) is None]
            out.append(f"{pid}: host {', '.join(missing)} not observable on this engine")
            continue
        if lk and not hi:
            out.append(f"{pid}: {lk} host lookups found no usable checkpoint")
        if hi and not fe:
            out.append(f"{pid}: {hi} host hits without a completed restore")
        if fe and not re:
            out.append(f"{pid}: {fe} tokens restored but prefill reused none")
        if re and fe and re < fe:
            out.append(f"{pid}: restored {fe} tokens, prefill reused {re}")
    return out
