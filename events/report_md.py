"""report.md: the window report as Markdown, a pure function of the report dict."""

from __future__ import annotations

import time

from events.window_fold import RESTORE_CHECKS, failed_checks

STATUS_MARK = {"measured": "MEASURED", "failed": "FAILED ✗", "invalid": "INVALID ⚠", "deferred": "DEFERRED ⏸"}
CHECKS = RESTORE_CHECKS


def val(v: object) -> str:
    """None means not observable or not applicable: say so, never print it as zero."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def utc(wall_ns: int | None) -> str:
    return "—" if wall_ns is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall_ns // 1_000_000_000))


def clock_words(r: dict) -> str:
    """How a rehearsal kept time, in words (minutes are the simulator's, or the wall clock's times a scale)."""
    c = r.get("clock") or {}
    if c.get("kind") == "virtual":
        return f" in virtual time (seed {c.get('sim_seed')})"
    return " on the wall clock"


def ms(ns: int | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:.0f}"


def check(v: object) -> str:
    return {True: "pass", False: "FAIL", None: "not applicable"}.get(v, str(v))  # type: ignore[call-overload]


def render_md(r: dict) -> str:
    return "\n".join(md_lines(r))


def num(v: float | None, places: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{places}f}"


SCHEDULE_HEAD = ["phase", "status", "started (min)", "estimated end (min)", "ended (min)", "end − estimate (min)"]


def schedule_rows(r: dict) -> list[list[str]]:
    """Each phase that started: where the estimate put its end, and where it really ended."""
    rows = []
    for c in r["cells"]:
        if c.get("started_minute") is None:
            continue
        est, end = c.get("estimated_end_minute"), c.get("ended_minute")
        rows.append([c["phase"], c["status"], num(c["started_minute"]), num(est), num(end),
                     num(end - est if end is not None and est is not None else None)])
    return rows


TRACE_ARM_HEAD = ["arm", "trace", "status", "requests", "host reused", "TTFT p50 (ms)", "TTFT p90 (ms)",
                  "latency p50 (ms)", "latency p90 (ms)"]
TRACE_PAIR_HEAD = ["concurrency", "repetition", "TTFT p50 on−off (ms)", "TTFT p90 on−off (ms)",
                   "latency p50 on−off (ms)", "latency p90 on−off (ms)"]


def trace_arm_rows(tr: dict) -> list[list[str]]:
    return [[a["phase"], a["trace"], a["status"], str(a["requests"]), val(a["host_reused_tokens"]),
             num(a["ttft_p50_ms"]), num(a["ttft_p90_ms"]), num(a["latency_p50_ms"]), num(a["latency_p90_ms"])]
            for a in tr.get("arms", [])]


def trace_pair_rows(tr: dict) -> list[list[str]]:
    return [[f"C{p['concurrency']}", f"r{p['repetition']}"]
            + ([num(p[f"{k}_on_minus_off"]) for k in ("ttft_p50_ms", "ttft_p90_ms", "latency_p50_ms", "latency_p90_ms")]
               if p["measured"] else ["pair not measured"] * 4)
            for p in tr.get("pairs", [])]


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(x) + " |" for x in rows]


def needs_attention(r: dict) -> list[str]:
    """What a person must act on, for the top of every format: a restoration that did not verify
    (with the checks that failed) and every alarm."""
    res = r.get("restoration") or {}
    out = []
    if res and not res.get("verified"):
        failed = failed_checks(res)
        out.append(f"restoration NOT verified: {', '.join(failed) or 'see Restoration'} failed")
    out += [f"alarm {a['kind']}: {a['detail']}" for a in r.get("alarms") or []]
    it = r.get("integrity") or {}
    if it and not it.get("chain_ok"):  # nothing below can be trusted: say so first
        out.insert(0, f"LOG INTEGRITY FAILED: the chain does not verify ({it.get('problem') or 'see Integrity'})")
    if it and not it.get("audit_ok", True):
        out.insert(0, f"LOG AUDIT FAILED: replayed decisions differ ({it.get('audit_problem') or 'see Integrity'})")
    return out


def md_lines(r: dict, request_cells: list[tuple[str, ...]] | None = None) -> list[str]:
    """report.md as its lines (joined with newlines), so a writer can take them a batch at a time."""
    v = r.get("verdict") or {}
    timing = r.get("timing") or {}
    out = [f"# Window {r['window_id']}", "",
           f"Plan **{r.get('plan')}** (sha256 {r.get('plan_sha256')}) on site **{r.get('site')}**"
           f"{' — rehearsal against the simulator' + clock_words(r) if r.get('rehearsal') else ''}. t0 {utc(r.get('t0_wall'))}; "
           f"stop at minute {val(timing.get('stop_min'))}, window ends at minute {val(timing.get('window_min'))}.", "",
           f"Outcome: **{val(r.get('outcome'))}**"]
    if r.get("abort"):
        a = r["abort"]
        out[-1] += f" — aborted at minute {val(a['minute'])}: **{a['reason']}** ({a['detail']})"
    attention = needs_attention(r)
    if attention:
        out += ["", "> **Needs attention**"] + [f"> - {x}" for x in attention]
    out += ["", "## Verdict", "", f"**{val(v.get('hypothesis'))}** — {val(v.get('basis'))}", "",
            f"Next causal experiment: {val(v.get('next_experiment'))}", ""]
    out += [f"- {f}" for f in v.get("findings", [])]
    out += ["", "## Cells", "",
            "| phase | status | reason | requests | host lookups | host hits | host fetched | host reused | "
            "GPU hits | GPU reused | comparable |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in r["cells"]:
        h, g = c.get("host") or {}, c.get("gpu") or {}
        out.append(f"| {c['phase']} | {STATUS_MARK.get(c['status'], c['status'])} | {c['reason']} | {c['requests']} | "
                   f"{val(h.get('lookups'))} | {val(h.get('hits'))} | {val(h.get('fetched_tokens'))} | "
                   f"{val(h.get('reused_tokens'))} | {val(g.get('hits'))} | {val(g.get('reused_tokens'))} | "
                   f"{'yes' if c['comparable'] else 'no — not comparable'} |")
    nf = r.get("natural_failures") or []
    out += ["", "## Natural output failures (kept apart from aborts)", ""]
    out += [f"- {f['phase']} #{f['order_index']} (body {f['body_index']}): {f['kind']}" for f in nf] or ["- none"]
    tr = r.get("trace") or {}
    out += ["", "## Trace arms", "", f"Frozen order: {', '.join(tr.get('order') or []) or 'n/a'}", ""]
    if tr.get("arms"):
        out += md_table(TRACE_ARM_HEAD, trace_arm_rows(tr))
        out += ["", f"Off/on pairs, on minus off ({tr.get('note')}):", ""] + md_table(TRACE_PAIR_HEAD, trace_pair_rows(tr))
    else:
        out += ["- none run"]
    sched = schedule_rows(r)
    out += ["", "## Schedule: estimate against actual", ""] + (md_table(SCHEDULE_HEAD, sched) if sched else ["- no phase started"])
    ident = r.get("identity") or {}
    exp = ident.get("expected") or {}
    out += ["", "## Identity", "",
            f"Incumbent recipe sha256 before: {val(ident.get('incumbent_sha256_before'))}; after restore: "
            f"{val(ident.get('incumbent_sha256_after'))}. Candidate recipe: {val(ident.get('candidate_recipe'))}.", "",
            *recipe_lines(r), "",
            "| field | expected | " + " | ".join(o["label"] for o in ident.get("observed", [])) + " |",
            "|---|---|" + "---|" * len(ident.get("observed", []))]
    for k in exp:
        out.append(f"| {k} | {val(exp[k])} | " + " | ".join(
            (val(o["identity"].get(k)) + (" ≠" if k in o["mismatches"] else "")) for o in ident.get("observed", [])) + " |")
    res = r.get("restoration") or {}
    out += ["", "## Restoration", ""]
    if res:
        out += [f"- minutes {val(res.get('started_minute'))} to {val(res.get('finished_minute'))}; "
                f"verified: **{val(res.get('verified'))}**"] + [f"- {k}: {check(res.get(k))}" for k in CHECKS]
    else:
        out.append("- not recorded (the window is still open)")
    out += ["", "## Drain checks", "", "| purpose | settled | waited (s) | polls | minute |", "|---|---|---|---|---|"]
    out += [f"| {d['purpose']} | {val(d['settled'])} | {d['waited_s']} | {d['polls']} | {val(d['minute'])} |"
            for d in r.get("drains", [])]
    out += ["", "## Timeline", ""] + [f"- minute {val(t['minute'])}: {t['event']}" for t in r["timeline"]]
    if r.get("alarms"):
        out += ["", "## Alarms", ""] + [f"- {a['kind']}: {a['detail']}" for a in r["alarms"]]
    out += ["", "## Requests", ""]
    out += request_table(request_rows(r) if request_cells is None else request_cells)
    it = r["integrity"]
    out += ["", "## Integrity", "", f"- events {it.get('events')}, head seq {it.get('head_seq')}, hash {it.get('head_hash')}",
            f"- chain ok: {val(it.get('chain_ok'))}, audit ok: {val(it.get('audit_ok'))}", ""]
    return out


REQUEST_COLUMNS = ("phase", "order", "body sha256", "prompt", "completion", "cached", "finish", "visible",
                   "first token ms", "end ms", "host lookups", "host hits", "host fetched", "host reused", "GPU reused",
                   "outcome")


def request_row(q: dict) -> tuple[str, ...]:
    # called once per request per format: kept to plain lookups, it dominates long reports
    g = q.get
    d = g("delta") or {}
    dg = d.get
    cells = [g("prompt_tokens"), g("completion_tokens"), g("cached_tokens"), g("finish_reason")]
    counts = [dg("host_lookups"), dg("host_hits"), dg("host_fetched_tokens"), dg("host_reused_tokens"),
              dg("gpu_reused_tokens")]
    ft, end = g("first_token_ns"), g("end_ns")
    nf = g("natural_failure")
    return (q["phase"], str(q["order_index"]), q["body_sha256"][:12],
            *["n/a" if x is None else str(x) for x in cells],
            "yes" if g("visible_output") else ("reasoning only" if g("reasoning_only") else "no"),
            "n/a" if ft is None else f"{ft / 1e6:.0f}", "n/a" if end is None else f"{end / 1e6:.0f}",
            *["n/a" if x is None else str(x) for x in counts],
            q["outcome"] + (f" ({nf})" if nf else ""))


def request_rows(r: dict) -> list[tuple[str, ...]]:
    """Every request's table cells in report order (the phase first); md and html tables share them."""
    return [request_row(q) for q in r.get("requests", [])]


def request_table(rows: list[tuple[str, ...]]) -> list[str]:
    if not rows:
        return ["- none"]
    out = ["| " + " | ".join(REQUEST_COLUMNS) + " |", "|" + "---|" * len(REQUEST_COLUMNS)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def recipe_lines(r: dict) -> list[str]:
    """The retained recipe bytes and the rollback preview, one line each."""
    rec = r.get("recipes") or {}
    out = []
    for role in ("incumbent", "candidate"):
        x = rec.get(role)
        if x:
            out.append(f"- {role} recipe {x['recipe']}: sha256 {x['sha256']}, {x['bytes']} bytes retained at "
                       f"{x.get('path') or 'n/a (not written)'}")
        else:
            out.append(f"- {role} recipe: bytes not retained")
    rb = rec.get("rollback")
    out.append(f"- rollback: load {rb['recipe']} sha256 {rb['sha256']} previewed ({'; '.join(rb['preview']) or 'no steps'})"
               if rb else "- rollback: not previewed")
    return out
