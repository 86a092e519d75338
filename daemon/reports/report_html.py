"""report.html: one self-contained page (inline CSS and SVG, no script, nothing fetched).

The first screen answers "is my host back?" and "what did we learn?"; charts come before the
evidence tables, and the per-request detail, collapsed, comes last.
"""

from __future__ import annotations

from html import escape

from flare_diag.daemon.reports import charts
from flare_diag.events.report import CHARTED_COUNTERS, REPLAY_PREFIXES, Segment, join_segments
from flare_diag.daemon.reports.report_view import (
    COST_HEAD, COST_WORDS, STARTING_HEAD, cost_rows, stamp_line, starting_line, starting_rows,
    CELL_HEAD, DRAIN_HEAD, REPRODUCER_WORDS, LATENCY_HEAD, OCCUPANCY_HEAD, RESTORE_CHECKS, SCHEDULE_HEAD, TRACE_ARM_HEAD, TRACE_PAIR_HEAD,
    alarm_line, caveats, cell_rows, fault_lines, check, clock_at, clock_words, drain_limit_s, drain_rows, drain_summary, latency_rows,
    natural_failure_rows, needs_attention, settle_rows,
    abort_when, occupancy_rows, recipe_lines, reproducer_command, request_columns, request_rows, restoration_line, schedule_rows, snapshot_rows,
    trace_arm_rows, trace_pair_rows, trace_stamp_caveat, utc, val, OVERHEAD_HEAD, overhead_line, overhead_rows,
    CONSISTENCY_DIFF_HEAD, CONSISTENCY_HEAD, CONSISTENCY_WORDS, consistency_rows,
    GUARD_HEAD, STEADY_WORDS, guard_points, guard_rows,
    VERDICT_WORDS, abort_words, audit_words, failure_cells, grouped, identity_lines, n, natural_failures_line,
)

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.2em auto;max-width:min(96vw,110em);color:#222;padding:0 1em}
h1{font-size:1.4em;margin:.2em 0}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;font-weight:600;font-size:12px}
.st-measured{background:#dff3e0;color:#17602a;border:1px solid #2ca02c}
.st-failed{background:#fde2e1;color:#8c1d18;border:1px solid #d62728}
.st-invalid{background:#fff3cd;color:#7a5200;border:1px dashed #e0a000}
.st-deferred{background:#e8eef7;color:#34495e;border:1px dotted #6b7c93}
tr.st-failed td{background:#fff6f6}tr.st-invalid td{background:#fffbea}tr.st-deferred td{color:#567}
.outcome{font-size:1.25em;margin:.3em 0}.outcome-completed{color:#17602a}.outcome-partial{color:#8a5a00}
.outcome-aborted,.outcome-restore_failed{color:#8c1d18}
.restored{font-size:1.1em;padding:.35em .7em;border-radius:4px;margin:.3em 0}
.restored.ok{background:#dff3e0;border:1px solid #2ca02c}.restored.bad{background:#fbeaea;border:2px solid #8c1d18}
.verdict{border-left:4px solid #1f77b4;padding:.2em .9em;margin:.6em 0;background:#f6f9fc}
.attention{border:2px solid #8c1d18;background:#fbeaea;padding:.4em .8em;margin:1em 0}.attention ul{margin:.3em 0}
table.requests td{text-align:right;font-variant-numeric:tabular-nums}table.requests td:first-child{text-align:left}
.pass{color:#17602a}.fail{color:#8c1d18;font-weight:700}.na{color:#777}.mism{color:#8c1d18;font-weight:700}
details{margin:.4em 0}summary{cursor:pointer}figure{margin:1em 0}code{font-size:12px;overflow-wrap:anywhere}.meta{color:#555}
.tw{max-width:100%;overflow-x:auto}table#cells{width:100%}table#cells td:last-child{min-width:14em}
@media (max-width:900px){body{font-size:13px;padding:0 .4em}td,th{padding:2px 4px}}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,56em),1fr));gap:0 2em}
"""


def _badge(status: str) -> str:
    return f'<span class="badge st-{escape(status)}">{escape(status)}</span>'


def _check(v: object) -> str:
    cls = {True: "pass", False: "fail", None: "na"}.get(v, "")  # type: ignore[call-overload]  # a bool or None key; any other value falls to ''
    return f'<span class="{cls}">{escape(check(v))}</span>'


def _table(head: list[str] | tuple[str, ...], rows: list[list[str]], num_from: int = 99) -> str:
    """A table of plain text cells (escaped here)."""
    return table_open(head) + "".join(table_row(r, num_from) for r in rows) + TABLE_CLOSE


def table_open(head: list[str] | tuple[str, ...]) -> str:
    h = "".join(f"<th>{escape(c)}</th>" for c in head)
    return f"<div class=tw><table><thead><tr>{h}</tr></thead><tbody>"


def table_row(cells: list[str] | tuple[str, ...], num_from: int = 99) -> str:
    return "<tr>" + "".join(f'<td{" class=num" if i >= num_from else ""}>{escape(c)}</td>' for i, c in enumerate(cells)) + "</tr>"


TABLE_CLOSE = "</tbody></table></div>"
FAILURE_HEAD = ("phase", "order", "body", "kind")


def _figure(chart_id: str, svg: str, caption: str = "") -> str:
    cap = f"<figcaption class=meta>{escape(caption)}</figcaption>" if caption else ""
    return f'<figure id="{chart_id}" class=chart>{svg}{cap}</figure>'




def gantt_chart(r: dict) -> str:
    t = r.get("timing") or {}
    rows = [(c["phase"], c["started_minute"], c.get("ended_minute") if c.get("ended_minute") is not None
             else c["started_minute"], c["status"]) for c in r["cells"] if c.get("started_minute") is not None]
    res = r.get("restoration") or {}
    if res.get("started_minute") is not None and res.get("finished_minute") is not None:
        rows.append(("restore", res["started_minute"], res["finished_minute"], "restore"))
    a = r.get("abort")
    marks = [(a["minute"], f"abort: {a['reason']}")] if a and a.get("minute") is not None else []
    return charts.gantt("Phase timeline", rows, t.get("window_min") or 90, t.get("stop_min") or 70, marks)


def reuse_chart(r: dict) -> str:
    panels = getattr(r, "reuse_panels", None)  # a report projected without its request rows keeps these
    if panels is None:
        panels = {}
        for q in r.get("requests", []):
            if q["phase"].startswith(REPLAY_PREFIXES):
                v = (q.get("delta") or {}).get("host_reused_tokens")
                if v is not None:
                    panels.setdefault(q["phase"], []).append((q["order_index"], v))
    return charts.columns_grid("Host reuse by replay order, one panel per phase", list(panels.items()),
                               "replay order (request index)", "host reused (tokens)")


def occupancy_chart(r: dict) -> str:
    panels = []
    for k in ("rows", "pages"):
        bars = []
        for o in r.get("occupancy") or []:
            used, cap = o.get(f"{k}_used_peak"), o.get(f"{k}_capacity")
            if used is not None and cap:
                bars.append((o["phase"], 100 * used / cap, f"{charts.fmt(used)} of {charts.fmt(cap)}"))
        panels.append((f"{k} used at peak, of the {k} pool", bars))
    return charts.hbars_grid("Host cache capacity against peak occupancy, per phase", panels,
                             "peak used (% of capacity)", per_row=2, max_value=100, value_fmt=lambda v: f"{v:g}%")


def churn_chart(r: dict) -> str:
    occ = r.get("occupancy") or []
    kinds = [("stores", k) for k in sorted({k for o in occ for k in (o.get("stores") or {})})]
    kinds += [("evictions", k) for k in sorted({k for o in occ for k in (o.get("evictions") or {})})]
    panels = [(f"{what}: {k}", [(o["phase"], float((o.get(what) or {}).get(k) or 0),
                                 charts.fmt((o.get(what) or {}).get(k) or 0)) for o in occ]) for what, k in kinds]
    if any(o.get("compactions") is not None for o in occ):
        panels.append(("compactions", [(o["phase"], float(o.get("compactions") or 0), charts.fmt(o.get("compactions") or 0))
                                       for o in occ]))
    return charts.hbars_grid("Stores per checkpoint kind, evictions per pool and compactions, per phase", panels,
                             "count per phase (events)", per_row=3)


def latency_chart(r: dict) -> str:
    lat = r.get("latency") or []
    return charts.ranges("Time to first token and latency per phase (p50 dot, p90 bar end)",
                         [("time to first token", [(x["phase"], x["ttft_p50_s"], x["ttft_p90_s"]) for x in lat]),
                          ("latency", [(x["phase"], x["latency_p50_s"], x["latency_p90_s"]) for x in lat])],
                         "window seconds from send (s)")


def guard_charts(r: dict) -> str:
    """One chart per steady-state guard, beside the phases (shaded) and the abort and restore marks."""
    ss = r.get("steady_state") or {}
    spans = [(c["started_minute"], c["ended_minute"], c["phase"]) for c in r.get("cells", [])
             if c.get("started_minute") is not None and c.get("ended_minute") is not None]
    marks = []
    a = r.get("abort")
    if a and a.get("minute") is not None:
        marks.append((a["minute"], f"abort: {a['reason']}"))
    res = r.get("restoration") or {}
    if res.get("started_minute") is not None:
        marks.append((res["started_minute"], "restore"))
    if res.get("finished_minute") is not None:
        marks.append((res["finished_minute"], "restored"))
    out = []
    for g in ss.get("guards", []):
        title = f"Guard {g['name']}" + (" (dry run)" if g.get("dry_run") else "")
        out.append(_figure(f"chart-guard-{g['name']}", charts.guard(title, guard_points(g), g["threshold"], "value",
                                                                      spans, marks),
                           f"{g['query']}: breaches when {g['breach_if']} {g['threshold']:g}; red points breached."))
    return "".join(out)


def counter_chart(r: dict) -> str:
    points = getattr(r, "counter_points", None)  # a projected report has them (its series may be in a spool)
    if points is None:
        cols = r.get("counters") or {}
        minutes = cols.get("minute", [])
        points = {}
        for k in CHARTED_COUNTERS:
            d = charts.Decimated()
            d.extend(minutes, cols.get(k, []))
            points[k] = d.points()
    t = r.get("timing") or {}
    loads = sorted(c["started_minute"] for c in r.get("cells", [])
                   if c["phase"].endswith(".identity") and c.get("started_minute") is not None)
    series = [(k, per_incarnation(points[k], loads)) for k in CHARTED_COUNTERS if points.get(k)]  # reused dashed over fetched
    marks = [(t[k], label) for k, label in (("stop_min", "stop"), ("window_min", "window end")) if t.get(k) is not None]
    # every new incarnation starts its counters at zero (contract 1): say where, so a drop is not read as a fault
    marks += [(c["started_minute"], f"{c['phase'].split('.')[0]} loaded, counters from 0") for c in r.get("cells", [])
              if c["phase"].endswith(".identity") and c.get("started_minute") is not None]
    span = (0.0, float(t["window_min"])) if t.get("window_min") else None
    return charts.lines("Cumulative counters over the window", series, "window minute (min)", "cumulative (tokens)",
                        sorted(marks), x_span=span)


def per_incarnation(points: list[tuple[float, float]], loads: list[float]) -> list[tuple[float, float | None]]:
    """A cumulative series broken between incarnations: at each load, and wherever it falls (a counter
    falls only when a new incarnation starts it again at zero), so that no line joins two incarnations."""
    out: list[tuple[float, float | None]] = []
    pending = list(loads)
    prev: float | None = None
    for x, y in points:
        crossed = bool(pending) and x >= pending[0]
        while pending and x >= pending[0]:
            pending.pop(0)
        if out and (crossed or (prev is not None and y < prev)):
            out.append((x, None))
        out.append((x, y))
        prev = y
    return out


def drain_chart(r: dict) -> str:
    poll = (r.get("timing") or {}).get("drain_poll_s")
    return charts.settle("Time to settle around each phase, against the drain limit", settle_rows(r),
                         drain_limit_s(r, "drain_timeout_s"),
                         "time to settle (window s" + (f", to the {poll:g} s poll that saw it)" if poll else ")"))


CHARTS = (("chart-timeline", gantt_chart, "Each phase from its start to its end; the shaded band is the restore reservation."),
          ("chart-reuse", reuse_chart, "Host reused tokens of each request, in the order it was sent."),
          ("chart-occupancy", occupancy_chart, "Allocation capacity against live occupancy: the seed's central distinction."),
          ("chart-churn", churn_chart, "What the host cache stored, evicted and compacted while each phase ran."),
          ("chart-latency", latency_chart, "Nearest-rank percentiles of the requests that answered."),
          ("chart-counters", counter_chart, "The engine's own counters at each scrape."),
          ("chart-drains", drain_chart, "How long the engine took to settle before and after each phase; the dashed line is the limit a drain may wait."))


def render_html(r: dict) -> str:
    return join_segments(html_segments(r))


def html_segments(r: dict, request_cells: list[tuple[str, ...]] | None = None) -> list[Segment]:
    """report.html as newline-separated segments; a request table is one segment of many rows."""
    p: list[Segment] = [f"<!doctype html><html lang=en><head><meta charset=utf-8>"
                        f"<meta name=viewport content=\"width=device-width,initial-scale=1\">"
                        f"<title>flare-diag report {escape(r['window_id'])}</title><style>{CSS}</style></head><body>"]
    p += _head(r) + _verdict(r) + _cells(r)
    if r.get("steady_state"):
        p.append("<h2 id=steady-state>Steady state</h2><p>" + escape(STEADY_WORDS) + "</p>"
                 + _table(GUARD_HEAD, guard_rows(r)) + "<div class=charts>" + guard_charts(r) + "</div>")
    p.append("<h2>Charts</h2><div class=charts>"
             + "".join(_figure(cid, make(r), cap) for cid, make, cap in CHARTS) + "</div>")
    p += _evidence(r)
    p += _detail(r, request_cells)
    p.append("</body></html>\n")
    return p


def _head(r: dict) -> list[Segment]:
    timing = r.get("timing") or {}
    a = r.get("abort")
    res = r.get("restoration") or {}
    out: list[Segment] = [
        f"<h1>Window {escape(r['window_id'])}</h1>",
        f"<p id=outcome class=outcome>Outcome: <b class=\"outcome-{escape(val(r.get('outcome')))}\">{escape(val(r.get('outcome')))}</b>"
        + (f" — aborted {escape(abort_when(a))}: <b>{escape(a['reason'])}</b> ({escape(abort_words(a))})"
           if a else "")
        + "</p>",
        f"<p id=restoration-line class=\"restored {'ok' if res.get('verified') else 'bad'}\">{escape(restoration_line(r))}</p>"]
    attention = needs_attention(r)
    if attention:
        out.append("<div class=attention><b>Needs attention</b><ul>" + "".join(f"<li>{escape(x)}</li>" for x in attention)
                   + "</ul></div>")
    out.append(f"<p class=meta>Plan <b>{escape(val(r.get('plan')))}</b> (sha256 <code>{escape(val(r.get('plan_sha256')))}</code>)"
               f" on site <b>{escape(val(r.get('site')))}</b>"
               f"{' — <i>rehearsal against the simulator' + escape(clock_words(r)) + '</i>' if r.get('rehearsal') else ''}. "
               f"t0 {escape(utc(r.get('t0_wall')))}; stop at minute {escape(val(timing.get('stop_min')))}, "
               f"window ends at minute {escape(val(timing.get('window_min')))}.</p>")
    return out


def _verdict(r: dict) -> list[Segment]:
    v = r.get("verdict") or {}
    cav = caveats(r)
    words = VERDICT_WORDS.get(v.get("hypothesis") or "")
    title = (f"{escape(words)} <code>{escape(v['hypothesis'])}</code>" if words else escape(val(v.get("hypothesis"))))
    return [f"<section id=verdict class=verdict><h2>Verdict: {title}</h2>"
            f"<p>{escape(grouped(val(v.get('basis'))))}</p>"
            + (("<p><b>Caveats</b></p><ul>" + "".join(f"<li>{escape(c)}</li>" for c in cav) + "</ul>") if cav else "")
            + f"<p><b>Next step:</b> {escape(val(v.get('next_experiment')))}</p>"
            + (f"<p><b>Reproduce it:</b> <code>{escape(cmd)}</code> {escape(REPRODUCER_WORDS)}.</p>"
               if (cmd := reproducer_command(r)) else "") + "</section>"]


def _cells(r: dict) -> list[Segment]:
    rows = []
    for row in cell_rows(r):
        status = row[1].split(" · ")[0]
        note = " <small>not comparable</small>" if "not comparable" in row[1] else ""
        rows.append(f'<tr class="st-{escape(status)}"><td>{escape(row[0])}</td><td>{_badge(status)}{note}</td>'
                    + "".join(f"<td class=num>{escape(x)}</td>" for x in row[2:6]) + f"<td>{escape(row[6])}</td></tr>")
    nf = natural_failures_line(r)
    out: list[Segment] = ["<h2>Cells</h2><div class=tw><table id=cells><thead><tr>"
                          + "".join(f"<th>{escape(x)}</th>" for x in CELL_HEAD)
                          + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>"
                          + (f"<p class=meta>{escape(nf)}</p>" if nf else "")]
    found, diffs = consistency_rows(r)
    if found:
        out.append(f"<h2 id=consistency>Output consistency</h2><p>{escape(CONSISTENCY_WORDS)}</p>"
                   + _table(CONSISTENCY_HEAD, found, num_from=1)
                   + (_table(CONSISTENCY_DIFF_HEAD, diffs) if diffs else ""))
    return out


def _trace_evidence(r: dict) -> list[Segment]:
    """The trace overhead: the frozen order, the arms, their off/on pairs and the overhead judged on them."""
    tr = r.get("trace") or {}
    p: list[Segment] = [f"<h3>Trace overhead</h3><p>Frozen order: {escape(', '.join(tr.get('order') or []) or 'n/a')}</p>"]
    if not tr.get("arms"):
        return [*p, "<p>none run</p>"]
    p += [_table(TRACE_ARM_HEAD, trace_arm_rows(tr), 3),
          f"<p>Off/on pairs, on minus off ({escape(tr.get('note') or '')}):</p>", _table(TRACE_PAIR_HEAD, trace_pair_rows(tr), 2)]
    if tr.get("overhead"):
        caveat = trace_stamp_caveat(r)
        p.append(f"<p>{escape(overhead_line(tr) + ('' if caveat is None else ' ' + caveat))}</p>"
                 + _table(OVERHEAD_HEAD, overhead_rows(tr), 1))
    return p


def _evidence(r: dict) -> list[Segment]:
    p: list[Segment] = ["<h2>Evidence</h2>"]
    ident = r.get("identity") or {}
    p.append("<h3>Identity</h3>"
             f"<p>Incumbent recipe sha256 before: <code>{escape(val(ident.get('incumbent_sha256_before')))}</code>; "
             f"after restore: <code>{escape(val(ident.get('incumbent_sha256_after')))}</code>. "
             f"Candidate recipe: {escape(val(ident.get('candidate_recipe')))}.</p>"
             "<ul>" + "".join(f"<li>{escape(line[2:])}</li>" for line in recipe_lines(r)) + "</ul>")
    p.append("<ul class=identity>" + "".join(
        f"<li>{escape(who)}: " + (f"<span class=mism>{escape(what)}</span>" if differs else escape(what)) + "</li>"
        for who, what, differs in identity_lines(r)) + "</ul>")
    snaps = snapshot_rows(r)
    p.append("<h3>Router, monitoring, GPU and configuration</h3>"
             + (_table(["snapshot", "when", "minute", "what it showed"], snaps) if snaps else "<p>none recorded</p>"))
    res = r.get("restoration")
    p.append("<h3 id=restoration>Restoration checks</h3>")
    if res:
        p.append(f"<p>Minutes {escape(val(res.get('started_minute')))} to {escape(val(res.get('finished_minute')))}; "
                 f"verified: {_check(res.get('verified'))}</p>")
        p.append("<table><thead><tr><th>check</th><th>result</th></tr></thead><tbody>"
                 + "".join(f"<tr><td>{k}</td><td>{_check(res.get(k))}</td></tr>" for k in RESTORE_CHECKS) + "</tbody></table>")
    else:
        p.append("<p>not recorded (the window is still open)</p>")
    drains = r.get("drains") or []
    unsettled = [d for d in drains if not d["settled"]]
    summary = drain_summary(r)
    p.append("<h3>Drain checks</h3>" + (f"<details{' open' if unsettled else ''}><summary>{escape(summary)}</summary>"
                                        + _table(DRAIN_HEAD, drain_rows(r), 2) + "</details>" if drains else "<p>none</p>"))
    occ = occupancy_rows(r)
    p.append("<h3>Host cache: capacity against occupancy</h3><p class=meta>Peaks are the largest gauge readings scraped "
             "while the phase ran; counts are the phase's counter deltas.</p>"
             + (_table(OCCUPANCY_HEAD, occ, 1) if occ else "<p>not observed</p>"))
    start = starting_line(r)
    if start:
        p.append(f"<h3 id=starting-observation>Starting observation</h3><p>{escape(start)}</p>"
                 + _table(STARTING_HEAD, starting_rows(r), 1))
    costs = cost_rows(r)
    p.append(f"<h3 id=costs>Costs per phase: queue, prefill, decode, output</h3><p class=meta>{escape(COST_WORDS)}</p>"
             + (_table(COST_HEAD, costs, 1) if costs else "<p>no request answered</p>"))
    lat = latency_rows(r)
    p.append("<h3>Time to first token and latency per phase</h3><p class=meta>Window seconds from each request's send; "
             "nearest-rank percentiles; descriptive.</p>" + (_table(LATENCY_HEAD, lat, 1) if lat else "<p>no request answered</p>")
             + ("" if (stamps := stamp_line(r)) is None else f"<p class=meta>{escape(stamps)}</p>"))
    p += _trace_evidence(r)
    sched = schedule_rows(r)
    p.append("<h3>Schedule: estimate against actual</h3>" + (_table(SCHEDULE_HEAD, sched, 2) if sched else "<p>no phase started</p>"))
    p.append(f"<details><summary>Timeline: {len(r['timeline'])} events</summary>"
             + _table(["minute", "time (UTC)", "event"], [[val(t["minute"]), clock_at(r, t["minute"]), t["event"]]
                                                        for t in r["timeline"]]) + "</details>")
    if r.get("alarms"):
        p.append("<h3>Alarms</h3><ul>" + "".join(f"<li><b>{escape(x['kind'])}</b>: {escape(alarm_line(r, x).split(': ', 1)[1])}</li>"
                                                  for x in r["alarms"]) + "</ul>")
    if r.get("faults"):
        p.append("<h3>Injected faults (rehearsal)</h3><ul>" + "".join(f"<li>{escape(x)}</li>" for x in fault_lines(r)) + "</ul>")
    it = r["integrity"]
    p.append("<h3>Integrity</h3>"
             f"<p>{n(it.get('events'))} events, head seq {n(it.get('head_seq'))}, hash <code>{escape(str(it.get('head_hash')))}</code>; "
             f"chain {_check(it.get('chain_ok'))}, audit {_check(it.get('audit_ok'))}.</p>"
             + (f"<p>Audit: {escape(audit_words(it))}: {escape(it['audit_policy'])}</p>" if it.get("audit_policy") else ""))
    return p


def _detail(r: dict, request_cells: list[tuple[str, ...]] | None) -> list[Segment]:
    p: list[Segment] = ["<h2 id=detail>Per-request detail</h2>"]
    nf = natural_failure_rows(r)
    p.append("<h3>Natural output failures, per phase</h3><p class=meta>Kept apart from aborts: the engine answered, "
             "the answer fell short.</p>")
    spool = getattr(r, "spool", None)
    if nf:
        # every failure's row: written as the projection made it (a spool), or made here
        count = spool.failure_count if spool is not None else len(r.get("natural_failures") or [])
        rows = [spool.failures_html] if spool is not None else \
            [table_row(failure_cells(f)) for f in r.get("natural_failures") or []]
        p.append([_table(["phase", "failures (requests)", "kinds"], nf, 1)
                  + f"<details><summary>every natural failure ({count})</summary>" + table_open(FAILURE_HEAD),
                  *rows, TABLE_CLOSE + "</details>"])
    else:
        p.append("<p>none</p>")
    p.append("<h3>Requests</h3>")
    if spool is not None:  # the phase tables were written as the projection made the rows
        p.append([spool.html] if spool.request_count else "<p>none</p>")
        return p
    head = request_head(r)
    by_phase: dict[str, list[tuple[str, ...]]] = {}
    for row in request_rows(r) if request_cells is None else request_cells:
        by_phase.setdefault(row[0], []).append(row)
    for phase, qs in by_phase.items():
        p.append(_phase_table(head, phase, qs))
    if not by_phase:
        p.append("<p>none</p>")
    return p


def _phase_table(head: str, phase: str, qs: list[tuple[str, ...]]) -> list[str]:
    return [phase_table_open(head, phase, len(qs)), *map(request_tr, qs), PHASE_TABLE_CLOSE]


def request_head(r: dict) -> str:
    return "".join(f"<th>{escape(c)}</th>" for c in request_columns(r))


def phase_table_open(head: str, phase: str, count: int) -> str:
    """A phase's collapsed table of request rows, up to its first row (`head`: request_head)."""
    return (f"<details><summary>{escape(phase)}: {count} requests</summary>"
            f"<div class=tw><table class=requests><thead><tr>{head}</tr></thead><tbody>")


PHASE_TABLE_CLOSE = "</tbody></table></div></details>"


def request_tr(row: tuple[str, ...]) -> str:
    # one escape per row (cells joined by a separator escape leaves alone): long reports have 10^5 rows
    return "<tr><td>" + escape("\x1f".join(row)).replace("\x1f", "</td><td>") + "</td></tr>"
