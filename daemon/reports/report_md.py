"""report.md: the window report as Markdown, a pure function of the report dict.

Order (for a person reading it at 3 a.m.): the outcome and whether the host is back; the verdict,
its caveats and the next step; the cells; the evidence; the per-request detail last.
"""

from __future__ import annotations

from collections.abc import Sequence

from flare_diag.daemon.reports.report_view import (
    COST_HEAD, COST_WORDS, STARTING_HEAD, cost_rows, stamp_line, starting_line, starting_rows,
    CELL_HEAD, DRAIN_HEAD, REPRODUCER_WORDS, LATENCY_HEAD, OCCUPANCY_HEAD, RESTORE_CHECKS, SCHEDULE_HEAD, TRACE_ARM_HEAD, TRACE_PAIR_HEAD,
    alarm_line, caveats, cell_rows, fault_lines, check, clock_at, clock_words, drain_rows, drain_summary, latency_rows, natural_failure_rows, needs_attention,
    abort_when, occupancy_rows, recipe_lines, reproducer_command, request_columns, request_rows, restoration_line, schedule_rows, snapshot_rows,
    trace_arm_rows, trace_pair_rows, trace_stamp_caveat, utc, val, OVERHEAD_HEAD, overhead_line, overhead_rows,
    CONSISTENCY_DIFF_HEAD, CONSISTENCY_HEAD, CONSISTENCY_WORDS, consistency_rows,
    GUARD_HEAD, STEADY_WORDS, guard_rows,
    VERDICT_WORDS, abort_words, audit_words, grouped, identity_lines, n, natural_failures_line, num,
)
from flare_diag.events.report import Segment, join_segments

STATUS_MARK = {"measured": "MEASURED", "failed": "FAILED ✗", "invalid": "INVALID ⚠", "deferred": "DEFERRED ⏸"}


def render_md(r: dict) -> str:
    return join_segments(md_lines(r))


def md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [md_row(head), "|" + "---|" * len(head)] + [md_row(x) for x in rows]


def md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def md_lines(r: dict, request_cells: list[tuple[str, ...]] | None = None) -> list[Segment]:
    """report.md as its lines (joined with newlines), so a writer can take them a batch at a time; the
    request table of a spooled report is one segment of pieces (events/report.py's text_chunks)."""
    return _head(r) + _verdict(r) + _cells(r) + _evidence(r) + _detail(r, request_cells)


def _head(r: dict) -> list[str]:
    timing = r.get("timing") or {}
    out = [f"# Window {r['window_id']}", "",
           f"Outcome: **{val(r.get('outcome'))}**", "", f"**{restoration_line(r)}**"]
    if r.get("abort"):
        a = r["abort"]
        out[2] += f" — aborted {abort_when(a)}: **{a['reason']}** ({abort_words(a)})"
    attention = needs_attention(r)
    if attention:
        out += ["", "> **Needs attention**"] + [f"> - {x}" for x in attention]
    out += ["", f"Plan **{r.get('plan')}** (sha256 {r.get('plan_sha256')}) on site **{r.get('site')}**"
                f"{' — rehearsal against the simulator' + clock_words(r) if r.get('rehearsal') else ''}. "
                f"t0 {utc(r.get('t0_wall'))}; stop at minute {val(timing.get('stop_min'))}, "
                f"window ends at minute {val(timing.get('window_min'))}."]
    return out + provenance(r)


def provenance(r: dict) -> list[str]:
    """What the window relied on before it started: the review of its plan, the offline harness's rehearsal,
    and the preserved history it promised to leave untouched."""
    out = []
    rv = r.get("review")
    if rv:
        out += ["", f"Plan reviewed by **{rv.get('by')}**" + (f" ({rv['note']})" if rv.get("note") else "")
                + f", recorded in {rv.get('log')} at seq {rv.get('seq')} (event sha256 {str(rv.get('hash'))[:12]})."]
    h = r.get("harness")
    if h:
        out += ["", f"Offline harness: rehearsed this plan's bytes against the simulator ({h.get('scenario')}) before "
                    f"anything changed: **{h.get('outcome')}**, verdict {h.get('verdict')}, {h.get('forecast')}; its log's "
                    f"head seq {h.get('log_head_seq')}, hash {str(h.get('log_head_hash'))[:16]}"
                    + (f" ({h['folder']})" if h.get("folder") else "") + "."]
    f = r.get("harness_fitted")
    if f:
        out += ["", f"Offline harness against the reproducer's model {f.get('scenario')}: **{f.get('outcome')}**"
                    + (f", verdict {f.get('verdict')}, {f.get('forecast')}" if f.get("outcome") != "not_applicable"
                       else f" ({f.get('forecast')})") + "."]
    for p in r.get("preserved") or []:
        state = {True: "unchanged", False: "**CHANGED**", None: "not checked after publishing"}[p.get("unchanged")]
        out += ["", f"Preserved: `{p['path']}`: {state} (sha256 {str(p.get('sha256_before'))[:12]})."]
    return out


def _verdict(r: dict) -> list[str]:
    v = r.get("verdict") or {}
    words = VERDICT_WORDS.get(v.get("hypothesis") or "")
    title = f"**{words}** (`{v['hypothesis']}`)" if words else f"**{val(v.get('hypothesis'))}**"
    out = ["", "## Verdict", "", f"{title} — {grouped(val(v.get('basis')))}", ""]
    cav = caveats(r)
    if cav:
        out += ["Caveats:", ""] + [f"- {c}" for c in cav] + [""]
    out += [f"Next step: {val(v.get('next_experiment'))}"]
    cmd = reproducer_command(r)
    if cmd:
        out += ["", f"Reproduce it: `{cmd}` {REPRODUCER_WORDS}."]
    return out


def _cells(r: dict) -> list[str]:
    rows = []
    for row in cell_rows(r):
        status, _, rest = row[1].partition(" · ")
        rows.append([row[0], STATUS_MARK.get(status, status) + (f" · {rest}" if rest else ""), *row[2:]])
    out = ["", "## Cells", ""] + md_table(CELL_HEAD, rows)
    nf = natural_failures_line(r)
    if nf:
        out += ["", nf]
    if r.get("steady_state"):
        out += ["", "## Steady state", "", STEADY_WORDS, ""] + md_table(GUARD_HEAD, guard_rows(r))
    found, diffs = consistency_rows(r)
    if found:
        out += ["", "## Output consistency", "", CONSISTENCY_WORDS, ""] + md_table(CONSISTENCY_HEAD, found)
        if diffs:
            out += [""] + md_table(CONSISTENCY_DIFF_HEAD, diffs)
    return out


def _evidence(r: dict) -> list[str]:
    out = ["", "## Evidence"]
    ident = r.get("identity") or {}
    out += ["", "### Identity", "",
            f"Incumbent recipe sha256 before: {val(ident.get('incumbent_sha256_before'))}; after restore: "
            f"{val(ident.get('incumbent_sha256_after'))}. Candidate recipe: {val(ident.get('candidate_recipe'))}.", "",
            *recipe_lines(r), ""]
    out += [f"- {who}: " + (f"**{what}**" if differs else what) for who, what, differs in identity_lines(r)]
    snaps = snapshot_rows(r)
    out += ["", "### Router, monitoring, GPU and configuration", ""]
    out += md_table(["snapshot", "when", "minute", "what it showed"], snaps) if snaps else ["- none recorded"]
    res = r.get("restoration") or {}
    out += ["", "### Restoration checks", ""]
    if res:
        out += [f"- minutes {num(res.get('started_minute'))} to {num(res.get('finished_minute'))}; "
                f"verified: **{val(res.get('verified'))}**"] + [f"- {k}: {check(res.get(k))}" for k in RESTORE_CHECKS]
    else:
        out.append("- not recorded (the window is still open)")
    out += ["", "### Drain checks", "", drain_summary(r) + ".", ""] + (md_table(DRAIN_HEAD, drain_rows(r)) if r.get("drains") else [])
    occ = occupancy_rows(r)
    out += ["", "### Host cache: capacity against occupancy", "",
            "Peaks are the largest gauge readings scraped while the phase ran; counts are the phase's counter deltas.", ""]
    out += md_table(OCCUPANCY_HEAD, occ) if occ else ["- not observed (no phase scraped the host cache's gauges)"]
    start = starting_line(r)
    if start:
        out += ["", "### Starting observation", "", start, ""] + md_table(STARTING_HEAD, starting_rows(r))
    costs = cost_rows(r)
    out += ["", "### Costs per phase: queue, prefill, decode, output", "", COST_WORDS, ""]
    out += md_table(COST_HEAD, costs) if costs else ["- no request answered"]
    lat = latency_rows(r)
    out += ["", "### Time to first token and latency per phase", "",
            "Window seconds from each request's send; nearest-rank percentiles; descriptive.", ""]
    out += md_table(LATENCY_HEAD, lat) if lat else ["- no request answered"]
    if (stamps := stamp_line(r)) is not None:
        out += ["", stamps]
    tr = r.get("trace") or {}
    out += ["", "### Trace overhead", "", f"Frozen order: {', '.join(tr.get('order') or []) or 'n/a'}", ""]
    if tr.get("arms"):
        out += md_table(TRACE_ARM_HEAD, trace_arm_rows(tr))
        out += ["", f"Off/on pairs, on minus off ({tr.get('note')}):", ""] + md_table(TRACE_PAIR_HEAD, trace_pair_rows(tr))
        if tr.get("overhead"):
            caveat = trace_stamp_caveat(r)
            out += ["", overhead_line(tr) + ("" if caveat is None else " " + caveat), ""] + md_table(OVERHEAD_HEAD, overhead_rows(tr))
    else:
        out += ["- none run"]
    sched = schedule_rows(r)
    out += ["", "### Schedule: estimate against actual", ""] + (md_table(SCHEDULE_HEAD, sched) if sched else ["- no phase started"])
    out += ["", "### Timeline", ""] + md_table(["minute", "time (UTC)", "event"],
                                               [[val(t["minute"]), clock_at(r, t["minute"]), t["event"]] for t in r["timeline"]])
    if r.get("alarms"):
        out += ["", "### Alarms", ""] + [f"- {alarm_line(r, a)}" for a in r["alarms"]]
    if r.get("faults"):
        out += ["", "### Injected faults (rehearsal)", ""] + [f"- {x}" for x in fault_lines(r)]
    it = r["integrity"]
    out += ["", "### Integrity", "", f"- events {n(it.get('events'))}, head seq {n(it.get('head_seq'))}, hash {it.get('head_hash')}",
            f"- chain ok: {val(it.get('chain_ok'))}, audit ok: {val(it.get('audit_ok'))}"]
    if it.get("audit_policy"):
        out.append(f"- audit: {audit_words(it)}: {it['audit_policy']}")
    return out


def _detail(r: dict, request_cells: list[tuple[str, ...]] | None) -> list[Segment]:
    nf = natural_failure_rows(r)
    out: list[Segment] = ["", "## Per-request detail", "", "### Natural output failures (kept apart from aborts), per phase", ""]
    out += md_table(["phase", "failures (requests)", "kinds"], nf) if nf else ["- none"]
    out += ["", "### Requests", ""]
    spool = getattr(r, "spool", None)
    if spool is not None:  # the rows were written as the projection made them
        head = md_table(request_columns(r), [])
        out.append([head[0], "\n" + head[1], spool.md] if spool.request_count else "- none")
        out.append("")
        return out
    rows = request_rows(r) if request_cells is None else request_cells
    out += md_table(request_columns(r), rows) if rows else ["- none"]
    out.append("")
    return out
