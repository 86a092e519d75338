"""Interpretation: the verdict of contract section 4, findings, and the seed's next causal experiment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flare_diag.policies.verdicts import judged

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
    "restore_path": (
        "Host lookups found checkpoints in A.reverse_replay but no restore completed (0 tokens fetched): inspect the "
        "restore/transfer path on those requests (host transfer in-flight/waiting gauges, restore errors, transfer "
        "timeouts), not the keys; the keys matched."
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

# The same order probe on the GPU prefix cache (a plan's `[verdict] tier = "gpu_prefix"`: an engine with
# no host tier, a bare vLLM): what prefill skipped because its blocks were still on the GPU. There are no
# lookups, restores or checkpoints to tell apart there, so the rule ends at churn or not.
GPU_PREFIX_NEXT = {
    "not_reproduced": (
        "Fresh-incarnation forward/forward reused GPU prefix-cache blocks, so zero reuse did not reproduce on this "
        "tier: compare the original run's starting occupancy and exact body bytes before any policy work."
    ),
    "prefix_cache_churn": (
        "The forward replay reused no prefix block while the reverse replay did: the prefix cache holds fewer blocks "
        "than the replay's working set and evicts in the order the bodies arrive. Compare the working set's blocks "
        "with the engine's (vllm:cache_config_info num_gpu_blocks x block_size) before any policy work."
    ),
    "no_prefix_reuse": (
        "Even the reverse replay reused no prefix block: check that prefix caching is enabled and that the bodies "
        "share full blocks (prompts shorter than one block are never cached) before anything else."
    ),
}

TIER_FIELD = {"host": "host", "gpu_prefix": "gpu"}  # the cell's figures each tier's rule reads


UNOBSERVABLE = (
    "The window measured A.reverse_replay, but this host does not expose how many host-cached tokens prefill reused: "
    "map the engine's metric for them in the site profile's [metrics] (docs/engines.md) or run on a host that exports "
    "it; without it no cause can be named."
)

NO_HITS = (
    "Expose how many host lookups found stored state (map the engine's hit counter in the site profile's [metrics], "
    "docs/engines.md) or read the engine's own log for failed loads on A.reverse_replay's requests; without it the "
    "restore path and key eligibility cannot be told apart."
)

RESTORED_UNUSED = (
    "Reverse replay fetched {fetched} host tokens but prefill reused none: inspect why restored state was not used "
    "(the checkpoint positions against the prompts' shared prefixes, the rendered message-prefix keys, which of the "
    "three checkpoints the fetched state came from) before touching eviction or compaction."
)


# Contract section 4 (amended 2026-12-01): a replay reads the state its own prime left, so it is
# usable only when that prime is measured on the same incarnation. A cell may name its prime
# itself (`prime`); these are the 2026-10-22 plan's.
ORDER_PROBE = "A.reverse_replay"  # the cell every verdict of the seed's rule reads first
PRIMES = {"A.reverse_replay": "A.forward_prime", "B.forward_replay": "B.forward_prime"}


def unusable(cells: Mapping[str, Mapping[str, Any]], phase: str) -> str | None:
    """Why `phase`'s cell cannot feed the verdict, or None when it can: not measured, measured on an
    identity that drifted by its close, or a replay whose prime is not measured on its incarnation."""
    cell = cells.get(phase)
    if not cell:
        return "not run"
    if cell.get("status") != "measured":
        return f"{cell.get('status')}: {cell.get('reason') or 'no reason recorded'}"
    if cell.get("identity_held") is False:
        return "its closing identity differed from the identity verified for its incarnation"
    prime = cell.get("prime") or PRIMES.get(phase)
    if prime:
        pc = cells.get(prime)
        if not pc or pc.get("status") != "measured" or pc.get("identity_held") is False:
            return f"its prime {prime} was not measured"
        if pc.get("incarnation_id") != cell.get("incarnation_id"):
            return f"its prime {prime} ran on another incarnation ({pc.get('incarnation_id')}, not {cell.get('incarnation_id')})"
    return None


def _reused(cells: Mapping[str, Mapping[str, Any]], phase: str, tier: str = "host") -> int | None:
    if unusable(cells, phase):
        return None
    return ((cells[phase].get(TIER_FIELD[tier]) or {}).get("reused_tokens"))


RUN_B_ARM = ("Run the B arm: a fresh incarnation B, forward prime then forward replay of the same bodies, "
             "after the incumbent is restored; the replay-order control decides between churn and a result "
             "that does not reproduce.")


COLD_START = ("{lead} on an incarnation that starts cold; {phase}'s did not ({why}). A new incarnation that can "
              "reach the same host cache would start warm again, so empty every host cache it can reach (a KV store "
              "kept outside the engine included) or give it one of its own, and check that its counters read zero and "
              "its first request finds nothing, after the incumbent is restored.")
# what to run again when a phase the rule reads did not start cold: the B arm alone, or (the order probe's
# own cell) the whole window, whose B arm then did not run (policies/methods/cache_diagnostics.py)
COLD_LEAD = {"A": "Repeat the window, each arm", "B": "Run the B arm again"}


def _cold_start(cells: Mapping[str, Mapping[str, Any]], phase: str, otherwise: str) -> str:
    """The next step when `phase`, or the prime it reads, ran on an incarnation that did not start cold: another
    run on the same host would meet the same cache, so the step asks for a cold start first."""
    for pid in (phase, (cells.get(phase) or {}).get("prime") or PRIMES.get(phase)):
        cell = cells.get(pid) if pid else None
        if cell and cell.get("not_fresh"):
            return COLD_START.format(lead=COLD_LEAD[phase.split(".")[0]], phase=pid,
                                     why=cell.get("reason") or "no reason recorded")
    return otherwise


def verdict(cells: Mapping[str, Mapping[str, Any]], required: Sequence[str] = (), no_cause: str | None = None,
            tier: str = "host") -> tuple[str, str, str]:
    """(hypothesis, basis, next experiment) by contract section 4's amended rule, in its order: the
    seed's rule over the cells (`hypothesis`) under the rules every method's verdict keeps
    (policies/verdicts.py: no cause after `no_cause`, every unmeasured required cell named).

    `tier`: the cache the order probe reads (the plan's `[verdict] tier`)."""
    return judged(lambda c: hypothesis(c, tier), cells, required, no_cause)


def hypothesis(cells: Mapping[str, Mapping[str, Any]], tier: str = "host") -> tuple[str, str, str]:
    """The seed's rule alone: the order probe over the host tier, or the GPU prefix cache."""
    return _rule(cells) if tier == "host" else _prefix_rule(cells)


def _rule(cells: Mapping[str, Mapping[str, Any]]) -> tuple[str, str, str]:
    why_rev = unusable(cells, "A.reverse_replay")
    if why_rev:
        return ("inconclusive", f"A.reverse_replay is not usable ({why_rev})",
                _cold_start(cells, "A.reverse_replay", NEXT_EXPERIMENT["inconclusive"]))
    rev = cells["A.reverse_replay"]
    rev_host = rev.get("host") or {}
    if rev_host.get("reused_tokens") is None:
        return ("inconclusive", "A.reverse_replay was measured but host reused tokens are not observable on this target",
                UNOBSERVABLE)
    fwd_reused = _reused(cells, "B.forward_replay")
    if fwd_reused is not None and fwd_reused > 0:
        return ("not_reproduced", f"B.forward_replay measured with {fwd_reused} host reused tokens",
                NEXT_EXPERIMENT["not_reproduced"])
    rev_reused = rev_host["reused_tokens"]
    small_reused = _reused(cells, "B.small_control")
    if rev_reused > 0 or small_reused:
        seen = (f"A.reverse_replay reused {rev_reused} host tokens" if rev_reused > 0 else
                f"B.small_control reused {small_reused} host tokens while A.reverse_replay reused 0")
        if fwd_reused is None:
            # one diagnostic pair per order is needed to nominate a cause (contract 4, amended)
            why_fwd = unusable(cells, "B.forward_replay")
            return ("inconclusive", f"{seen}, but the replay-order control B.forward_replay was not measured ({why_fwd})",
                    _cold_start(cells, "B.forward_replay", RUN_B_ARM))
        return "row_checkpoint_churn", f"{seen}; B.forward_replay reused 0", NEXT_EXPERIMENT["row_checkpoint_churn"]
    hits, fetched = rev_host.get("hits"), rev_host.get("fetched_tokens")
    if hits is None:
        # nothing reused, and whether the lookups found anything is not observable: a restore that
        # failed after its keys matched (a KV connector whose loads fail) and keys that never matched
        # read the same here, so neither is named
        return ("inconclusive", "A.reverse_replay reused 0 host tokens, and this host does not expose its host hits: "
                "a failed restore and ineligible keys cannot be told apart", NO_HITS)
    if hits and fetched == 0:
        # lookups found checkpoints but no restore completed: the keys matched, the restore did not
        where = rev.get("hit_requests") or []
        which = f" (order indices {', '.join(map(str, where[:12]))}{', ...' if len(where) > 12 else ''})" if where else ""
        return ("restore_path", f"A.reverse_replay: {hits} host hits{which}, 0 tokens fetched, 0 reused",
                NEXT_EXPERIMENT["restore_path"])
    parts = [f"A.reverse_replay reused 0 host tokens ({hits if hits is not None else 'unobservable'} hits"
             + (f", {fetched} tokens fetched" if fetched else "") + ")"]
    if small_reused is not None:
        parts.append("B.small_control reused 0")
    # the next step says only what the figures show: state that was fetched did restore, and went unused
    nxt = RESTORED_UNUSED.format(fetched=fetched) if fetched else NEXT_EXPERIMENT["key_or_checkpoint_eligibility"]
    return "key_or_checkpoint_eligibility", "; ".join(parts), nxt


def _prefix_rule(cells: Mapping[str, Mapping[str, Any]]) -> tuple[str, str, str]:
    """The order probe on the GPU prefix cache: churn when the reverse replay reused blocks and the
    forward replay on a fresh incarnation reused none."""
    why_rev = unusable(cells, "A.reverse_replay")
    if why_rev:
        return ("inconclusive", f"A.reverse_replay is not usable ({why_rev})",
                _cold_start(cells, "A.reverse_replay", NEXT_EXPERIMENT["inconclusive"]))
    rev = _reused(cells, "A.reverse_replay", "gpu_prefix")
    if rev is None:
        return ("inconclusive", "A.reverse_replay was measured but GPU prefix-cache reused tokens are not observable "
                "on this target", UNOBSERVABLE.replace("host-cached", "prefix-cached"))
    fwd = _reused(cells, "B.forward_replay", "gpu_prefix")
    if fwd is not None and fwd > 0:
        return ("not_reproduced", f"B.forward_replay measured with {fwd} GPU prefix-cache reused tokens",
                GPU_PREFIX_NEXT["not_reproduced"])
    if rev > 0:
        seen = f"A.reverse_replay reused {rev} GPU prefix-cache tokens"
        if fwd is None:
            return ("inconclusive", f"{seen}, but the replay-order control B.forward_replay was not measured "
                    f"({unusable(cells, 'B.forward_replay')})", _cold_start(cells, "B.forward_replay", RUN_B_ARM))
        return "prefix_cache_churn", f"{seen}; B.forward_replay reused 0", GPU_PREFIX_NEXT["prefix_cache_churn"]
    return ("no_prefix_reuse", "A.reverse_replay reused 0 GPU prefix-cache tokens"
            + ("" if fwd is None else "; B.forward_replay reused 0"), GPU_PREFIX_NEXT["no_prefix_reuse"])


def findings(cells: Mapping[str, Mapping[str, Any]]) -> list[str]:
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
