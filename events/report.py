"""The window report (contract section 4, schema flare-diag.report/1) as a pure fold over the log."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from events.envelope import Envelope
from events.schema import (
    AbortDecided, Alarm, CellRecorded, PhaseStarted, RequestDone, RequestMeasured, RestorationRecorded,
    RestoreStarted, TimeMarked, TraceOrderFrozen, VerdictReached, WindowClosed, WindowOpened,
)

SCHEMA = "flare-diag.report/1"


def project(envelopes: Iterable[Envelope], window_id: str, integrity: dict) -> dict:
    r: dict = {"schema": SCHEMA, "window_id": window_id, "plan": None, "t0_wall": None, "outcome": None,
               "abort": None, "cells": [], "verdict": None, "restoration": None, "integrity": integrity,
               "timeline": [], "requests": [], "alarms": [], "trace_order": None}
    cells: dict[str, dict] = {}
    responses: dict[tuple[str, int], dict] = {}
    for env in envelopes:
        if env.window_id != window_id:
            continue
        ev = env.event()
        if isinstance(ev, WindowOpened):
            r["plan"] = ev.plan.get("name")
            r["plan_sha256"] = ev.plan_sha256
            r["site"] = ev.site
            r["rehearsal"] = ev.rehearsal
        elif isinstance(ev, TimeMarked):
            if ev.mark == "t0":
                r["t0_wall"] = env.wall_ns
            r["timeline"].append({"minute": ev.minute, "event": ev.mark})
        elif isinstance(ev, PhaseStarted):
            r["timeline"].append({"minute": ev.minute, "event": f"phase {ev.phase} started"})
        elif isinstance(ev, CellRecorded):
            cells[ev.phase] = {"phase": ev.phase, "status": ev.status, "reason": ev.reason, "requests": ev.requests,
                               "host": ev.host, "gpu": ev.gpu, "comparable": ev.comparable,
                               "natural_failures": ev.natural_failures}
        elif isinstance(ev, RequestDone):
            responses[(ev.phase, ev.order_index)] = {
                "finish_reason": ev.finish_reason, "visible_output": ev.visible_output,
                "prompt_tokens": ev.prompt_tokens, "completion_tokens": ev.completion_tokens,
                "cached_tokens": ev.cached_tokens, "first_token_ns": ev.first_token_ns, "end_ns": ev.end_ns,
                "response_bytes": ev.response_bytes, "response_sha256": ev.response_sha256, "error": ev.error}
        elif isinstance(ev, RequestMeasured):
            d = {k: ev.delta.get(k) for k in ("host_lookups", "host_hits", "host_fetched_tokens", "host_reused_tokens",
                                              "gpu_hits", "gpu_reused_tokens")}
            r["requests"].append({"phase": ev.phase, "order_index": ev.order_index, "body_index": ev.body_index,
                                  "body_sha256": ev.body_sha256, "outcome": ev.outcome,
                                  "natural_failure": ev.natural_failure, "delta": d,
                                  **responses.get((ev.phase, ev.order_index), {})})
        elif isinstance(ev, AbortDecided):
            r["abort"] = {"reason": ev.reason, "detail": ev.detail, "minute": ev.minute}
            r["timeline"].append({"minute": ev.minute, "event": f"abort: {ev.reason}"})
        elif isinstance(ev, RestoreStarted):
            r["timeline"].append({"minute": ev.minute, "event": f"restore started ({ev.cause})"})
        elif isinstance(ev, RestorationRecorded):
            r["restoration"] = {"started_minute": ev.started_minute, "finished_minute": ev.finished_minute,
                                **ev.checks, "verified": ev.verified}
        elif isinstance(ev, VerdictReached):
            r["verdict"] = {"hypothesis": ev.hypothesis, "basis": ev.basis, "next_experiment": ev.next_experiment,
                            "findings": ev.findings}
        elif isinstance(ev, Alarm):
            r["alarms"].append({"kind": ev.kind, "detail": ev.detail})
        elif isinstance(ev, TraceOrderFrozen):
            r["trace_order"] = ev.order
        elif isinstance(ev, WindowClosed):
            r["outcome"] = ev.outcome
            r["timeline"].append({"minute": ev.minute, "event": f"window closed: {ev.outcome}"})
    r["cells"] = list(cells.values())
    return r


def render_json(report: dict) -> bytes:
    return msgspec.json.format(msgspec.json.encode(report), indent=1) + b"\n"


def render_md(report: dict) -> str:
    v = report.get("verdict") or {}
    lines = [f"# Window {report['window_id']} — {report.get('plan')}", "",
             f"Outcome: **{report.get('outcome')}**" + (f" — abort: {report['abort']['reason']} ({report['abort']['detail']})"
                                                        if report.get("abort") else ""), "",
             f"Verdict: **{v.get('hypothesis')}** — {v.get('basis')}", "", f"Next experiment: {v.get('next_experiment')}", "",
             "| phase | status | reason | requests | host lookups/hits/fetched/reused | GPU hits/reused | comparable |",
             "|---|---|---|---|---|---|---|"]
    for c in report["cells"]:
        h, g = c.get("host") or {}, c.get("gpu") or {}
        fmt = lambda d, ks: "/".join("n/a" if d.get(k) is None else str(d.get(k)) for k in ks) if d else "—"  # noqa: E731
        lines.append(f"| {c['phase']} | {c['status'].upper()} | {c['reason']} | {c['requests']} | "
                     f"{fmt(h, ('lookups', 'hits', 'fetched_tokens', 'reused_tokens'))} | {fmt(g, ('hits', 'reused_tokens'))} | "
                     f"{'yes' if c['comparable'] else 'no'} |")
    res = report.get("restoration") or {}
    lines += ["", "## Restoration", ""] + [f"- {k}: {val}" for k, val in res.items()]
    lines += ["", "## Findings", ""] + [f"- {f}" for f in v.get("findings", [])]
    lines += ["", "## Timeline", ""] + [f"- minute {t['minute']}: {t['event']}" for t in report["timeline"]]
    it = report["integrity"]
    lines += ["", "## Integrity", "", f"- events {it.get('events')}, head seq {it.get('head_seq')}, hash {it.get('head_hash')}",
              f"- chain ok: {it.get('chain_ok')}, audit ok: {it.get('audit_ok')}", ""]
    return "\n".join(lines)
