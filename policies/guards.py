"""Guards: an observation in, the abort it calls for (reason, detail) out, or None."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from flare_diag.policies import rules
from flare_diag.policies.plan import Growth

Abort = tuple[str, str] | None


@dataclass(frozen=True)
class Context:
    """What a watch rule judges an observation against: the plan's bounds, the snapshots taken before
    the take-down, and the identity the observation is held to (None: nothing to hold it to)."""

    growth: Growth
    gpu_snapshot: Mapping[str, Any] | None = None
    router_snapshot: Mapping[str, Any] | None = None
    identity: Mapping[str, Any] | None = None
    where: str = ""  # the phase (or "before readmit") a breach is named with
    direct_inflight: int = 0  # the window's own requests to the serving URL, in flight when it was read


Rule = Callable[[Mapping[str, Any], Context], Abort]


def growth_bounds(g: Growth) -> dict[str, Any]:
    return {"max_resident_bytes": g.max_resident_bytes, "max_host_cache_records": g.max_host_cache_records}


def action_observation(data: Mapping[str, Any], ref_labels: Mapping[str, Any] | None, quiesced: bool, growth: Growth,
                       host_cache_bytes: int | None) -> Abort:
    """Any action's reply that carries metrics labels or gauges: identity drift, uncontrolled growth."""
    labels = data.get("labels")
    if ref_labels and isinstance(labels, dict):
        drift = rules.label_drift(ref_labels, labels)
        if drift:
            return rules.drift_reason(ref_labels, labels, drift), "metrics identity changed: " + "; ".join(drift)
    gauges = data.get("gauges")
    if isinstance(gauges, dict) and quiesced:
        breach = rules.growth_breach(gauges, growth_bounds(growth), host_cache_bytes)
        if breach:
            return "uncontrolled_growth", breach
    return None


class Baseline(msgspec.Struct, frozen=True):
    """Growth relative to the incarnation's own first observation and to the window's own requests: a value."""

    resident: float | None = None
    excess_runs: int = 0

    def check(self, gauges: Mapping[str, Any], in_flight: int, growth: Growth) -> tuple[Baseline, Abort]:
        """The baseline after this observation, and the growth bound it breaches (or None)."""
        resident = gauges.get("resident_bytes")
        first = self.resident
        if resident is not None:
            if first is None:
                first = resident
            elif resident - first > growth.max_resident_growth_bytes:
                return self, ("uncontrolled_growth", (f"engine resident memory grew {(resident - first) / 2**30:.1f} GiB since "
                                                      f"the incarnation's first observation, beyond the bound "
                                                      f"{growth.max_resident_growth_bytes / 2**30:.1f} GiB"))
        runs = self.excess_runs
        queued = [gauges.get(k) for k in ("requests_active", "requests_pending", "requests_retiring")]
        if any(q is not None for q in queued):
            excess = sum(q or 0 for q in queued) - in_flight
            runs = runs + 1 if excess > growth.max_queue_excess else 0
            if runs >= growth.queue_excess_observations:
                return Baseline(first, runs), ("uncontrolled_growth", (
                    f"scheduler queue {excess:.0f} above the window's {in_flight} requests in flight "
                    f"for {runs} observations (bound {growth.max_queue_excess})"))
        return Baseline(first, runs), None


def incumbent_breaches(gauges: Mapping[str, Any], gpus: list[Mapping[str, Any]], growth: Growth) -> list[str]:
    """The plan's growth bounds that the incumbent, as it serves before anything changes, already
    breaches: each as 'key: reading'. A bound a healthy host breaches would abort every window it ran
    in and strand its primary, so such a plan is refused before the quiesce."""
    out = []
    for g in gpus:
        used, total = g.get("memory_used_bytes"), g.get("memory_total_bytes")
        if used is not None and total and used / total > growth.max_gpu_memory_fraction:
            out.append(f"growth.max_gpu_memory_fraction = {growth.max_gpu_memory_fraction:g}: GPU {g.get('uuid')} "
                       f"already uses {used / total:.3f} of its memory")
    resident = gauges.get("resident_bytes")
    if resident is not None and resident > growth.max_resident_bytes:
        out.append(f"growth.max_resident_bytes = {growth.max_resident_bytes}: the engine already holds {resident:.0f} B")
    records = gauges.get("host_cache_records")
    if records is not None and records > growth.max_host_cache_records:
        out.append(f"growth.max_host_cache_records = {growth.max_host_cache_records}: the host cache already holds "
                   f"{records:.0f} records")
    return out


def gpu_rules_disabled(data: Mapping[str, Any]) -> str | None:
    """What the GPU watch reports it cannot watch, as the rules that no longer fire, or None."""
    parts = []
    if data.get("unsupported"):
        parts.append("Xid events unsupported on " + "; ".join(map(str, data["unsupported"])))
    if data.get("xid_watch_error"):
        parts.append(f"the Xid watch failed: {data['xid_watch_error']}")
    if not parts:
        return None
    return "rule gpu_fault (Xid) disabled: " + "; ".join(parts)


def trace_toggle(expected: Mapping[str, Any], reply: Mapping[str, Any], ref_labels: Mapping[str, Any] | None, trace: bool) -> list[str]:
    """A trace toggle may change trace_enabled and nothing else."""
    mism = rules.identity_mismatches(expected, reply, trace=trace)
    mism += rules.label_drift({k: v for k, v in (ref_labels or {}).items() if k in ("incarnation", "recipe_sha256")}, reply)
    return mism


# --- the watch rules: one table, judged in the experiment, during the restore and at its last gate --

def xid_rule(data: Mapping[str, Any], ctx: Context) -> Abort:
    xids = data.get("xid_events") or []
    return ("gpu_fault", f"Xid {xids[0].get('xid')} on GPU {xids[0].get('gpu')}") if xids else None


def gpu_memory_rule(data: Mapping[str, Any], ctx: Context) -> Abort:
    breach = rules.gpu_memory_breach(data.get("gpus") or [], ctx.growth.max_gpu_memory_fraction)
    return ("uncontrolled_growth", breach) if breach else None


def gpu_identity_rule(data: Mapping[str, Any], ctx: Context) -> Abort:
    """The GPUs' UUIDs and power limits against the GPU snapshot taken before the take-down."""
    gpus = data.get("gpus")
    if not ctx.gpu_snapshot or not gpus or any("power_limit_w" not in g for g in gpus):
        return None  # a watch that does not carry them says nothing about them
    changes = rules.gpu_changes(ctx.gpu_snapshot.get("gpus") or [], gpus)
    if not changes:
        return None
    detail = "GPU watch: " + "; ".join(changes)
    return "identity_drift", f"{ctx.where}: {detail}" if ctx.where else detail


def containment_rule(data: Mapping[str, Any], ctx: Context) -> Abort:
    """The router after quiesce: its configuration unchanged, the quiesced backend receiving nothing."""
    snap = ctx.router_snapshot or {}
    backend = data.get("backend") or {}
    if snap.get("config_sha256") and data.get("config_sha256") not in (None, snap["config_sha256"]):
        return "containment", "router configuration changed during the window"
    if backend.get("admitted") or backend.get("inflight"):
        # `inflight` is routed requests only (docs/host-api.md); a router adapter that reports the
        # engine's running requests counts the window's own direct ones: said, never taken for the cause
        same = not backend.get("admitted") and backend.get("inflight") == ctx.direct_inflight
        # what was seen, no more: requests in flight are traffic; an admission alone is a route to it
        seen = "is receiving traffic" if backend.get("inflight") else "is admitted again, so the router may send it traffic"
        return "containment", (f"quiesced backend {backend.get('id')} {seen}"
                               f" (admitted={backend.get('admitted')}, inflight={backend.get('inflight')})"
                               + (f"; the window itself had {ctx.direct_inflight} direct request(s) in flight: a "
                                  f"router whose inflight counts the engine's running requests, not routed ones, "
                                  f"reads so too" if same else ""))
    return None


def identity_rule(data: Mapping[str, Any], ctx: Context) -> Abort:
    """An identity read (`{"identity": ...}`: the watch's, or the restore's last gate's), held to the identity it
    must be (None: nothing to hold it to). The watch's read that shows no incarnation at all comes with what
    /health said then (`health`: its status, or why it could not be read): one that did not answer 200 is an
    engine that is gone (`engine_lost`), not a drift; a read without it (logs before the watch asked, the
    restore's gate) is judged as any other."""
    ident = data.get("identity") or {}
    if ctx.identity is None:
        return None
    changes = rules.identity_changes(ctx.identity, ident)
    if not changes:
        return None
    health = data.get("health")
    if ident.get("incarnation") is None and isinstance(health, (int, str)) and health != 200:
        return "engine_lost", f"{ctx.where} shows no incarnation loaded and /health {rules.health_words(health)}"
    return rules.drift_reason(ctx.identity, ident, changes), f"{ctx.where}: " + "; ".join(changes)


# observation source -> the rules that judge it, in order (the first breach is the one reported)
WATCH_RULES: dict[str, tuple[Rule, ...]] = {
    "gpu": (xid_rule, gpu_memory_rule, gpu_identity_rule),
    "router": (containment_rule,),
    "identity": (identity_rule,),
}


def judge(source: str, data: Mapping[str, Any], ctx: Context) -> Abort:
    """The first breach the table's rules for `source` find in `data`, or None."""
    for rule in WATCH_RULES.get(source, ()):
        hit = rule(data, ctx)
        if hit:
            return hit
    return None
