"""Pure rules of the execution contract: abort classes, identity, growth, drain, counter deltas."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from flare_diag.events.answers import BuildIdentity

# Abort reasons of contract section 4 (plus "preflight": the window never touched the host).
ABORT_REASONS = ("identity_drift", "authentication", "malformed_transport", "gpu_fault", "containment",
                 "uncontrolled_growth", "watch_lost", "engine_lost", "engine_stalled", "operator", "daemon_restart",
                 "store_failure", "preflight", "steady_state", "engine_restart", "rejected", "unexpected_input", "not_as_sent")

# Aborts after which no cell may name a cause (contract 4, amended 2026-12-03): what the window measured
# may be an engine that restarted under it, or a host that refused the bodies themselves or changed them.
NO_CAUSE_ABORTS = ("engine_restart", "rejected", "unexpected_input", "not_as_sent")

# Reasons that are the host's fault: before anything was taken down they abort as `preflight` (the
# window refused a host it never changed), with the class kept in the detail.
HOST_FAULTS = ("identity_drift", "authentication", "malformed_transport", "gpu_fault", "containment",
               "uncontrolled_growth", "watch_lost", "engine_lost", "engine_stalled", "engine_restart", "rejected",
               "not_as_sent")

# A request's failure that may be its engine's end, after which /health is asked once: unavailable (a proxy's
# 502, an engine's 503), or failed inside the engine (HTTP 500, an error event in its stream: vLLM answers both
# once its EngineCore is dead, vllm/v1/engine/exceptions.py EngineDeadError, until its API server exits)
UNAVAILABLE = ("http_503", "http_502", "http_500", "engine_error")

# A call to the engine that failed in a way only the engine's own state can explain, after which the runner
# asks /health at once (the answer's `health_after`): a connection lost or refused, no answer within the
# call's deadline, a generation's stream that gave no event for the plan's stall bound (timing.stall_s)
ASK_HEALTH_AFTER = ("transport", "timeout", "stalled")

# How an adapter classifies a failed action or request -> the abort it causes (None: no abort).
ERROR_ABORTS = {
    "authentication": "authentication",
    "malformed_transport": "malformed_transport",
    "transport": "malformed_transport",
    "cuda_error": "gpu_fault",
    "out_of_memory": "gpu_fault",
    "gpu_fault": "gpu_fault",
    "identity_drift": "identity_drift",
    "containment": "containment",
    # a stream that gave no event for timing.stall_s while the engine's /health answered 200: it holds the
    # request and gives nothing; no more of the phase is sent into it (with /health not 200, `engine_lost`)
    "stalled": "engine_stalled",
    # a stream cut as it went on past its body's max_tokens (in events): the host did not serve the body as sent
    "overlong": "not_as_sent",
}

HOST_KEYS = ("lookups", "hits", "fetched_tokens", "reused_tokens")
GPU_KEYS = ("hits", "reused_tokens")
DRAIN_GAUGES = ("requests_active", "requests_pending", "requests_retiring",
                "host_transfers_inflight", "host_transfers_waiting")
IDENTITY_FIELDS: tuple[str, ...] = BuildIdentity.__struct_fields__  # the build fields every identity read is held to


def abort_for_error(error: str | None) -> str | None:
    return ERROR_ABORTS.get(error) if error else None


def health_words(health: int | str) -> str:
    """What /health said, as a report's words: 'answered 503', or 'could not be read (no connection)'."""
    return f"answered {health}" if isinstance(health, int) else f"could not be read ({health})"


def engine_gone(error: str | None, health_after: int | str | None) -> bool:
    """A read of the engine or a request to it that failed in transport, got no answer in time or stalled, after
    which /health did not answer 200: the engine is gone (`engine_lost`), and nothing says why; with the engine
    healthy, or logged before /health was asked after it, the failure is judged as its own class."""
    return error in ASK_HEALTH_AFTER and health_after is not None and health_after != 200


def identity_mismatches(expected: Mapping[str, Any], observed: Mapping[str, Any], *, trace: bool | None = None) -> list[str]:
    """Fields where the observed identity differs from the plan's, each as 'field: expected X, found Y'."""
    out = []
    for f in IDENTITY_FIELDS:
        if f in expected and observed.get(f) != expected[f]:
            out.append(f"{f}: expected {expected[f]!r}, found {observed.get(f)!r}")
    gpus = observed.get("gpus")
    if "gpu_count" in expected and gpus is not None:
        if len(gpus) != expected["gpu_count"]:
            out.append(f"gpus: expected {expected['gpu_count']}, found {len(gpus)}")
        for g in gpus:
            if g.get("power_limit_w") != expected.get("gpu_power_limit_w"):
                out.append(f"gpu {g.get('uuid')}: power limit expected {expected.get('gpu_power_limit_w')} W,"
                           f" found {g.get('power_limit_w')} W")
    if trace is not None and observed.get("trace_enabled") not in (None, trace):
        out.append(f"trace_enabled: expected {trace!r}, found {observed.get('trace_enabled')!r}")
    return out


def label_drift(reference: Mapping[str, Any], labels: Mapping[str, Any]) -> list[str]:
    """Identity labels from /metrics (build and incarnation info) that changed since the reference."""
    return [f"{k}: was {reference[k]!r}, now {labels.get(k)!r}"
            for k in sorted(reference) if k in labels and labels.get(k) != reference[k]]


def drift_reason(before: Mapping[str, Any], after: Mapping[str, Any], changes: list[str]) -> str:
    """The abort an identity's changes call for: `engine_restart` when the one field that changed is the
    incarnation, from one id to another (the same recipe and build, loaded again by nobody the window asked:
    the engine restarted unseen, contract 4 amended 2026-12-03); `identity_drift` for anything else."""
    restarted = (len(changes) == 1 and changes[0].startswith("incarnation: ")
                 and before.get("incarnation") is not None and after.get("incarnation") is not None)
    return "engine_restart" if restarted else "identity_drift"


def unseen_drain_gauges(gauges: Mapping[str, float | None]) -> list[str]:
    """Drain gauges this observation does not carry: never read as zero."""
    return [g for g in DRAIN_GAUGES if gauges.get(g) is None]


def drained(gauges: Mapping[str, float | None], accept_unobserved: Collection[str] = ()) -> bool:
    """Every drain gauge at zero; a gauge the host does not expose holds the drain unsettled unless
    the plan accepted a drain judged without it."""
    return all(gauges.get(g) == 0 if gauges.get(g) is not None else g in accept_unobserved for g in DRAIN_GAUGES)


def identity_changes(verified: Mapping[str, Any], observed: Mapping[str, Any]) -> list[str]:
    """Every identity field (GPU UUIDs and power limits included) that differs from the identity
    verified for the incarnation, as 'field: was X, now Y'. The trace switch is the one field a window
    changes itself: it is held to where the window last put it (the verified identity carries it only
    when the engine reports one; a trace toggle the host confirmed moves it: phases._set_trace)."""
    out = []
    for f in (*IDENTITY_FIELDS, "recipe_sha256", "incarnation", "trace_enabled"):
        if f in verified and observed.get(f) != verified[f]:
            out.append(f"{f}: was {verified[f]!r}, now {observed.get(f)!r}")
    if "gpus" in verified:
        out += gpu_changes(verified["gpus"] or [], observed.get("gpus") or [])
    return out


# the identity's contract fields a restore must bring back as they were before the take-down
RESTORED_FIELDS = (*IDENTITY_FIELDS, "trace_enabled", "recipe", "recipe_sha256", "incarnation")


def restored_changes(before: Mapping[str, Any], after: Mapping[str, Any], *, reloaded: bool) -> list[str]:
    """Every contract field of the identity after the restore that differs from before the take-down,
    as 'field: was X, now Y'; a reloaded incumbent is a new incarnation of the same recipe."""
    fields = [f for f in RESTORED_FIELDS if f in before and not (reloaded and f == "incarnation")]
    out = [f"{f}: was {before[f]!r}, now {after.get(f)!r}" for f in fields if after.get(f) != before[f]]
    if "gpus" in before:
        out += gpu_changes(before["gpus"] or [], after.get("gpus") or [])
    return out


def gpu_changes(reference: list[Mapping[str, Any]], observed: list[Mapping[str, Any]]) -> list[str]:
    """The GPUs' UUIDs and power limits against a reference list ("the same two GPUs at 300 W")."""
    ref = [(g.get("uuid"), g.get("power_limit_w")) for g in reference]
    now = [(g.get("uuid"), g.get("power_limit_w")) for g in observed]
    if sorted((u for u, _ in ref), key=str) != sorted((u for u, _ in now), key=str):
        return [f"GPUs: were {sorted(str(u) for u, _ in ref)}, now {sorted(str(u) for u, _ in now)}"]
    limits = dict(ref)
    return [f"GPU {u}: power limit was {limits[u]} W, now {w} W" for u, w in now if limits.get(u) != w]


def growth_breach(gauges: Mapping[str, float | None], bounds: Mapping[str, Any], expected_host_bytes: int | None) -> str | None:
    """The first bound crossed by these gauges, as a sentence, or None."""
    resident = gauges.get("resident_bytes")
    if resident is not None and resident > bounds["max_resident_bytes"]:
        return f"engine resident memory {resident:.0f} B exceeds the bound {bounds['max_resident_bytes']} B"
    used, cap = gauges.get("host_cache_bytes_used"), gauges.get("host_cache_bytes_capacity")
    if used is not None and cap is not None and used > cap:
        return f"host cache uses {used:.0f} B beyond its capacity {cap:.0f} B"
    if cap is not None and expected_host_bytes is not None and cap > expected_host_bytes:
        return f"host cache capacity {cap:.0f} B exceeds the recipe's {expected_host_bytes} B"
    for pool in ("rows", "pages"):
        u, c = gauges.get(f"{pool}_used"), gauges.get(f"{pool}_capacity")
        if u is not None and c is not None and u > c:
            return f"host cache {pool} pool holds {u:.0f}, beyond its capacity {c:.0f}"
    records = gauges.get("host_cache_records")
    if records is not None and records > bounds["max_host_cache_records"]:
        return f"host cache records {records:.0f} exceed the bound {bounds['max_host_cache_records']}"
    return None


def gpu_memory_breach(gpus: list[Mapping[str, Any]], max_fraction: float) -> str | None:
    for g in gpus:
        used, total = g.get("memory_used_bytes"), g.get("memory_total_bytes")
        if used is not None and total and used / total > max_fraction:
            return f"GPU {g.get('uuid')} memory {used / total:.3f} of total exceeds {max_fraction}"
    return None


def counter_delta(before: Mapping[str, float | None], after: Mapping[str, float | None]) -> dict[str, float | None]:
    """after - before per counter; None where either side is not observable."""
    out: dict[str, float | None] = {}
    for k in sorted(set(before) | set(after)):
        a, b = after.get(k), before.get(k)
        out[k] = None if a is None or b is None else a - b
    return out


def host_gpu(delta: Mapping[str, float | None]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The contract's host and GPU columns from a counter delta (None: not observable)."""
    def g(k: str) -> int | None:
        v = delta.get(k)
        return None if v is None else int(v)

    host = {k: g(f"host_{k}") for k in HOST_KEYS}
    gpu = {"hits": g("gpu_hits"), "reused_tokens": g("gpu_reused_tokens")}
    return host, gpu


# (tier, part, whole): under the contract's meanings a part is never larger than its whole (a hit is a
# lookup that found a checkpoint; reused tokens are restored tokens that prefill skipped; the GPU's reused
# tokens are tokens its prefix cache found)
COUNTER_PARTS = (("host", "hits", "lookups"), ("host", "reused_tokens", "fetched_tokens"), ("GPU prefix-cache", "reused_tokens", "hits"))


def counters_contradict(host: Mapping[str, int | None], gpu: Mapping[str, int | None]) -> list[str]:
    """A phase's counter deltas that cannot both be true (COUNTER_PARTS): an engine, or a metric mapping,
    whose numbers mean something else than the contract's."""
    out = []
    for tier, part, whole in COUNTER_PARTS:
        d = host if tier == "host" else gpu
        a, b = d.get(part), d.get(whole)
        if a is not None and b is not None and a > b:
            out.append(f"{tier} {part} {a:,} > {whole} {b:,}")
    return out


def traffic_from_elsewhere(delta: Mapping[str, float | None], sent: int) -> str | None:
    """What a phase's counters show beyond the requests the window sent it: the quiesced engine finished,
    or looked up, more requests than that (someone reaching it around the router), or None."""
    seen = [f"{verb} {int(v):,}" for k, verb in (("finished", "finished"), ("host_lookups", "looked up"))
            if (v := delta.get(k)) is not None and v > sent]
    return f"{' and '.join(seen)} requests while the window sent {sent:,}" if seen else None


def finished_short(delta: Mapping[str, float | None], answered: int) -> int | None:
    """The requests the engine counted as finished over a phase when that is fewer than the window's answered ones
    (each answered request is one the engine finished, if the engine answered it), or None."""
    finished = delta.get("finished")
    return int(finished) if finished is not None and finished < answered else None


def generated_short(delta: Mapping[str, float | None], generated: int | None) -> int | None:
    """The tokens the engine counted as generated over a phase when that is fewer than its answers' own
    completion_tokens add up to (every engine here counts each answer's tokens as it generates or finishes
    it), or None; None also where an answer did not say its count."""
    counted = delta.get("generation_tokens")
    return int(counted) if counted is not None and generated is not None and counted < generated else None


def counters_reset(counters: Mapping[str, float | None]) -> list[str]:
    """Counters that are not zero on a fresh incarnation."""
    return [k for k, v in sorted(counters.items()) if v]


# what an engine's own start-up requests move beside how many finished: their tokens, and the per-request
# timings' sums and counts (one sample a request); never a cache counter
STARTUP_MOVES = ("finished", "prompt_tokens", "generation_tokens", "engine_queue_s_sum", "engine_queue_s_count",
                 "engine_prefill_s_sum", "engine_prefill_s_count")


def startup_only(counters: Mapping[str, float | None], occupancy: Mapping[str, float | None], at_most: int,
                 generated_each: int) -> str | None:
    """Words for what a fresh incarnation shows when the engine's own start-up requests explain all of it: at
    most `at_most` finished, at most `generated_each` generated tokens each, at most one timing sample each,
    no other counter moved, and no host cache occupied beyond their own tokens (a cache sized in tokens that
    backs them up); None when they do not, or when the engine sends itself none (`at_most` 0)."""
    nonzero = counters_reset(counters)
    finished = counters.get("finished") or 0
    if not at_most or not nonzero or not 0 < finished <= at_most or any(k not in STARTUP_MOVES for k in nonzero):
        return None
    prompt, generated = counters.get("prompt_tokens") or 0, counters.get("generation_tokens") or 0
    if generated > finished * generated_each:
        return None
    if any((counters.get(f"{t}_count") or 0) > finished for t in ("engine_queue_s", "engine_prefill_s")):
        return None
    held = {k: v for k, v in occupancy.items() if v}
    if held and (set(held) != {"host_cache_tokens_used"} or held["host_cache_tokens_used"] > prompt + generated):
        return None
    return (f"{finished:g} start-up request{'' if finished == 1 else 's'} of the engine's own: {prompt:g} prompt, "
            f"{generated:g} generated tokens" + (f", {held['host_cache_tokens_used']:g} of them in the host cache" if held else ""))


def natural_failure(finish_reason: str | None, visible_output: bool) -> str | None:
    """Natural output failures are recorded, never aborted on."""
    if finish_reason == "length" and not visible_output:
        return "length_cut_empty_visible"
    if finish_reason == "length":
        return "length_cut"
    if not visible_output:
        return "empty_visible_output"
    return None
