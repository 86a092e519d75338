"""report.html: one self-contained page (inline CSS and SVG, no script, nothing fetched)."""

from __future__ import annotations

from html import escape

from events import charts
from events.report import Segment, join_segments
from events.report_md import (
    CHECKS, REQUEST_COLUMNS, SCHEDULE_HEAD, TRACE_ARM_HEAD, TRACE_PAIR_HEAD, check, needs_attention, recipe_lines, request_rows,
    schedule_rows, trace_arm_rows, trace_pair_rows, utc, val, clock_words,
)

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:78em;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;font-weight:600;font-size:12px}
.st-measured{background:#dff3e0;color:#17602a;border:1px solid #2ca02c}
.st-failed{background:#fde2e1;color:#8c1d18;border:1px solid #d62728}
.st-invalid{background:#fff3cd;color:#7a5200;border:1px dashed #e0a000}
.st-deferred{background:#e8eef7;color:#34495e;border:1px dotted #6b7c93}
tr.st-failed td{background:#fff6f6}tr.st-invalid td{background:#fffbea}tr.st-deferred td{color:#567}
.outcome-completed{color:#17602a}.outcome-partial{color:#8a5a00}.outcome-aborted,.outcome-restore_failed{color:#8c1d18}
.attention{border:2px solid #8c1d18;background:#fbeaea;padding:.4em .8em;margin:1em 0}.attention ul{margin:.3em 0}
table.requests td{text-align:right;font-variant-numeric:tabular-nums}table.requests td:first-child{text-align:left}
.pass{color:#17602a}.fail{color:#8c1d18;font-weight:700}.na{color:#777}.mism{color:#8c1d18;font-weight:700}
details{margin:.4em 0}summary{cursor:pointer}figure{margin:1em 0}code{font-size:12px}
"""


def _badge(status: str) -> str:
    return f'<span class="badge st-{escape(status)}">{escape(status)}</span>'


def _check(v: object) -> str:
    cls = {True: "pass", False: "fail", None: "na"}.get(v, "")  # type: ignore[call-overload]
    return f'<span class="{cls}">{escape(check(v))}</span>'


def _table(head: list[str], rows: list[list[str]], num_from: int = 99) -> str:
    h = "".join(f"<th>{escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i >= num_from else ""}>{c}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _reuse_chart(r: dict) -> str:
    series: dict[str, list[tuple[float, float]]] = {}
    for q in r.get("requests", []):
        if q["phase"].startswith(("A.", "B.")):
            v = (q.get("delta") or {}).get("host_reused_tokens")
            if v is not None:
                series.setdefault(q["phase"], []).append((q["order_index"], v))
    return charts.lines("Host reuse per request, in send order", list(series.items()), "order index",
                        "host reused tokens")


def _counter_chart(r: dict) -> str:
    cols = r.get("counters") or {}
    minutes = cols.get("minute", [])
    series = []
    for k in ("host_reused_tokens", "host_fetched_tokens", "gpu_reused_tokens"):
        s = [(m, v) for m, v in zip(minutes, cols.get(k, [])) if m is not None and v is not None]
        if s:
            series.append((k, s))
    t = r.get("timing") or {}
    marks = [(t[k], label) for k, label in (("stop_min", "stop"), ("window_min", "window end")) if t.get(k) is not None]
    return charts.lines("Counters over the window", series, "window minute", "tokens (cumulative)", marks)


def _drain_chart(r: dict) -> str:
    return charts.hbars("Drain waits", [(d["purpose"], d["waited_s"], d["settled"]) for d in r.get("drains", [])],
                        "window seconds waited (hatched: did not settle in time)")


def render_html(r: dict) -> str:
    return join_segments(html_segments(r))


def html_segments(r: dict, request_cells: list[tuple[str, ...]] | None = None) -> list[Segment]:
    """report.html as newline-separated segments; a request table is one segment of many rows."""
    v = r.get("verdict") or {}
    timing = r.get("timing") or {}
    a = r.get("abort")
    p: list[Segment] = [f"<!doctype html><html lang=en><head><meta charset=utf-8>"
                    f"<title>flare-diag report {escape(r['window_id'])}</title><style>{CSS}</style></head><body>",
                    f"<h1>Window {escape(r['window_id'])}</h1>",
                    f"<p>Plan <b>{escape(val(r.get('plan')))}</b> (sha256 <code>{escape(val(r.get('plan_sha256')))}</code>)"
                    f" on site <b>{escape(val(r.get('site')))}</b>"
                    f"{' — <i>rehearsal against the simulator' + escape(clock_words(r)) + '</i>' if r.get('rehearsal') else ''}. "
                    f"t0 {escape(utc(r.get('t0_wall')))}; stop at minute {escape(val(timing.get('stop_min')))}, "
                    f"window ends at minute {escape(val(timing.get('window_min')))}.</p>",
                    f"<p>Outcome: <b class=\"outcome-{escape(val(r.get('outcome')))}\">{escape(val(r.get('outcome')))}</b>"
                    + (f" — aborted at minute {escape(val(a['minute']))}: <b>{escape(a['reason'])}</b> "
                       f"({escape(a['detail'])})" if a else "") + "</p>"]
    attention = needs_attention(r)
    if attention:
        p.append("<div class=attention><b>Needs attention</b><ul>" + "".join(f"<li>{escape(x)}</li>" for x in attention)
                 + "</ul></div>")
    p += ["<h2>Verdict</h2>",
          f"<p><b>{escape(val(v.get('hypothesis')))}</b> — {escape(val(v.get('basis')))}</p>",
          f"<p>Next causal experiment: {escape(val(v.get('next_experiment')))}</p>"]
    if v.get("findings"):
        p.append("<ul>" + "".join(f"<li>{escape(f)}</li>" for f in v["findings"]) + "</ul>")

    p.append("<h2>Cells</h2><p>Status: " + " ".join(_badge(s) for s in ("measured", "failed", "invalid", "deferred"))
             + "</p>")
    rows = []
    for c in r["cells"]:
        h, g = c.get("host") or {}, c.get("gpu") or {}
        rows.append(f'<tr class="st-{escape(c["status"])}"><td>{escape(c["phase"])}</td><td>{_badge(c["status"])}</td>'
                    f'<td>{escape(c["reason"])}</td><td class=num>{c["requests"]}</td>'
                    + "".join(f"<td class=num>{escape(val(x))}</td>" for x in (
                        h.get("lookups"), h.get("hits"), h.get("fetched_tokens"), h.get("reused_tokens"),
                        g.get("hits"), g.get("reused_tokens")))
                    + f'<td>{"yes" if c["comparable"] else "<b>not comparable</b>"}</td></tr>')
    p.append("<table><thead><tr>" + "".join(f"<th>{x}</th>" for x in (
        "phase", "status", "reason", "requests", "host lookups", "host hits", "host fetched", "host reused",
        "GPU hits", "GPU reused", "comparable")) + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")

    p.append(f"<figure>{_reuse_chart(r)}</figure>")

    nf = r.get("natural_failures") or []
    p.append("<h2>Natural output failures</h2><p>Kept apart from aborts: the engine answered, the answer fell short.</p>")
    p.append(_table(["phase", "order", "body", "kind"], [[escape(f["phase"]), str(f["order_index"]),
                                                          str(f["body_index"]), escape(f["kind"])] for f in nf])
             if nf else "<p>none</p>")

    tr = r.get("trace") or {}
    p.append(f"<h2>Trace arms</h2><p>Frozen order: {escape(', '.join(tr.get('order') or []) or 'n/a')}</p>")
    if tr.get("arms"):
        p.append(_table(TRACE_ARM_HEAD, [[escape(x) for x in row] for row in trace_arm_rows(tr)]))
        p.append(f"<p>Off/on pairs, on minus off ({escape(tr.get('note') or '')}):</p>")
        p.append(_table(TRACE_PAIR_HEAD, [[escape(x) for x in row] for row in trace_pair_rows(tr)]))
    else:
        p.append("<p>none run</p>")
    sched = schedule_rows(r)
    p.append("<h2>Schedule: estimate against actual</h2>")
    p.append(_table(SCHEDULE_HEAD, [[escape(x) for x in row] for row in sched]) if sched else "<p>no phase started</p>")

    ident = r.get("identity") or {}
    obs = ident.get("observed", [])
    p.append("<h2>Identity</h2>"
             f"<p>Incumbent recipe sha256 before: <code>{escape(val(ident.get('incumbent_sha256_before')))}</code>; "
             f"after restore: <code>{escape(val(ident.get('incumbent_sha256_after')))}</code>. "
             f"Candidate recipe: {escape(val(ident.get('candidate_recipe')))}.</p>"
             "<ul>" + "".join(f"<li>{escape(line[2:])}</li>" for line in recipe_lines(r)) + "</ul>")
    exp = ident.get("expected") or {}
    p.append(_table(["field", "expected"] + [o["label"] for o in obs], [
        [escape(k), escape(val(exp[k]))] + [
            (f'<span class=mism>{escape(val(o["identity"].get(k)))} ≠</span>' if k in o["mismatches"]
             else escape(val(o["identity"].get(k)))) for o in obs]
        for k in exp]))

    res = r.get("restoration")
    p.append("<h2>Restoration</h2>")
    if res:
        p.append(f"<p>Minutes {escape(val(res.get('started_minute')))} to {escape(val(res.get('finished_minute')))}; "
                 f"verified: {_check(res.get('verified'))}</p>")
        p.append(_table(["check", "result"], [[k, _check(res.get(k))] for k in CHECKS]))
    else:
        p.append("<p>not recorded (the window is still open)</p>")

    p.append(f"<h2>Drain checks</h2><figure>{_drain_chart(r)}</figure>")
    p.append(f"<h2>Counters</h2><figure>{_counter_chart(r)}</figure>")

    p.append("<h2>Timeline</h2>")
    p.append(_table(["minute", "event"], [[escape(val(t["minute"])), escape(t["event"])] for t in r["timeline"]]))
    if r.get("alarms"):
        p.append("<h2>Alarms</h2><ul>" + "".join(f"<li><b>{escape(x['kind'])}</b>: {escape(x['detail'])}</li>"
                                                   for x in r["alarms"]) + "</ul>")

    p.append("<h2>Requests</h2>")
    by_phase: dict[str, list[tuple[str, ...]]] = {}
    for row in request_rows(r) if request_cells is None else request_cells:
        by_phase.setdefault(row[0], []).append(row)
    head = "".join(f"<th>{escape(c)}</th>" for c in REQUEST_COLUMNS)
    for phase, qs in by_phase.items():
        # one escape per row (cells joined by a separator escape leaves alone): long reports have 10^5 rows
        p.append([f"<details><summary>{escape(phase)}: {len(qs)} requests</summary>"
                  f"<table class=requests><thead><tr>{head}</tr></thead><tbody>",
                  *["<tr><td>" + escape("\x1f".join(row)).replace("\x1f", "</td><td>") + "</td></tr>"
                    for row in qs],
                  "</tbody></table></details>"])
    if not by_phase:
        p.append("<p>none</p>")

    it = r["integrity"]
    p.append("<h2>Integrity</h2>"
             f"<p>{it.get('events')} events, head seq {it.get('head_seq')}, hash <code>{escape(str(it.get('head_hash')))}</code>; "
             f"chain {_check(it.get('chain_ok'))}, audit {_check(it.get('audit_ok'))}.</p>")
    p.append("</body></html>\n")
    return p
