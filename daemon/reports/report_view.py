"""What report.md and report.html both say, in words and rows: the restoration line, the verdict's
caveats, the evidence tables with their units, and per-phase summaries of the request detail."""

from __future__ import annotations

import re
import time
from operator import attrgetter, itemgetter

from flare_diag.events.window_fold import RESTORE_CHECKS, failed_checks

# every count and time column names its unit
# narrow enough for 800 px: the host's two counts and two token totals share a column each, the
# comparability is said in the status, and the reason (the widest) comes last
CELL_HEAD = ["phase", "status", "requests", "host hits / lookups (requests)", "host reused / fetched (tokens)",
             "GPU reused (tokens)", "reason"]

# each hypothesis in words, for the person reading the report; the code name stays beside it
VERDICT_WORDS = {
    "row_checkpoint_churn": "Host cache churn: checkpoints were evicted before their replay could reuse them",
    "not_reproduced": "Not reproduced: the cache reused what it had stored",
    "restore_path": "Restore path: checkpoints were found, but their state never reached the GPU",
    "key_or_checkpoint_eligibility": "Keys or eligibility: no usable checkpoint was found, even for the newest bodies",
    "inconclusive": "Inconclusive: the cells that decide were not measured",
    "prefix_cache_churn": "Prefix cache churn: blocks were evicted before the forward replay could reuse them",
    "no_prefix_reuse": "No prefix reuse: not even the newest bodies' blocks were reused",
}


def n(v: object) -> str:
    """A count with thousands separators; otherwise as `val` says it (None is n/a, never zero)."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else val(v)


# a bare integer of four digits or more in a sentence: not part of a word, an id, a hash, a decimal, a
# time or a number already grouped
_BARE_COUNT = re.compile(r"(?<![\w.,:/+#-])\d{4,}(?![\w.,:/-])")


def grouped(text: str) -> str:
    """A sentence the policy recorded (a verdict's basis, a finding), with its counts grouped for the reader.
    The log keeps the sentence as the policy said it: its wording is part of the decision the audit
    replays, and a logged decision reworded by a later build would no longer replay."""
    return _BARE_COUNT.sub(lambda m: f"{int(m.group()):,}", text)


def val(v: object) -> str:
    """None means not observable or not applicable: say so, never print it as zero."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def num(v: float | None, places: int = 1) -> str:
    if v is None:
        return "n/a"
    out = f"{v:,.{places}f}"
    return out[1:] if out.startswith("-") and not out.strip("-0.,") else out  # never "-0.0"


def utc(wall_ns: int | None) -> str:
    return "—" if wall_ns is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall_ns // 1_000_000_000))


def scale_of(r: dict) -> float:
    return float((r.get("clock") or {}).get("time_scale") or 1.0)


def is_virtual(r: dict) -> bool:
    return (r.get("clock") or {}).get("kind") == "virtual"


def clock_words(r: dict) -> str:
    """How a rehearsal kept time, in words (minutes are the simulator's, or the wall clock's times a scale)."""
    c = r.get("clock") or {}
    if c.get("kind") == "virtual":
        return f" in virtual time (seed {c.get('sim_seed')})"
    s = scale_of(r)
    return " on the wall clock" + (f" at x{s:g}" if s != 1 else "")


def clock_at(r: dict, minute: float | None) -> str:
    """The time of day (UTC) of a window minute: t0's wall time plus the minute, on the wall clock
    (divided by a time scale); in virtual time the simulated time of day, said so."""
    t0 = r.get("t0_wall")
    if minute is None or t0 is None:
        return "—"
    secs = minute * 60 if is_virtual(r) else minute * 60 / scale_of(r)
    stamp = time.strftime("%H:%M:%S", time.gmtime(t0 // 1_000_000_000 + int(secs)))
    return stamp + (" (simulated)" if is_virtual(r) else "")


def abort_when(a: dict) -> str:
    """When the abort came: a window minute, or before t0 (its preflight, where no minute runs yet)."""
    return f"at minute {val(a.get('minute'))}" if a.get("minute") is not None else "before its t0 (at its preflight)"


def restoration_line(r: dict) -> str:
    """"Is my host back?" in one line."""
    res = r.get("restoration") or {}
    if not res:
        if r.get("outcome") is None:
            return "Restoration: not yet recorded (the window is still open)."
        return "Restoration: NOT recorded — the incumbent may not be serving; see Restoration."
    span = f"minutes {num(res.get('started_minute'))} to {num(res.get('finished_minute'))}"  # as the cells say them
    if res.get("host_changed") is False:  # stopped before its take-down: nothing of its own to restore
        if res.get("verified"):
            return ("Restoration: none needed — the window stopped before it changed anything on the host (no "
                    f"quiesce, unload, load or trace change was sent); the host as found: all {len(RESTORE_CHECKS)} "
                    "checks pass or do not apply.")
        return ("Restoration: none attempted — the window stopped before it changed anything on the host; the host "
                f"as found fails {', '.join(failed_checks(res)) or 'its checks'} — the primary needs a person.")
    if res.get("verified"):
        sha = (r.get("identity") or {}).get("incumbent_sha256_after")  # what the restore read back, nothing older
        readmit = {True: "primary readmitted", None: "nothing to readmit (no router, or never quiesced)"}.get(
            res.get("readmitted"), "")
        back = f"incumbent {str(sha)[:12]} back" if sha else "incumbent recipe hash matched"
        return (f"Restoration: verified ({span}): {back}"
                + (f", {readmit}" if readmit else "") + f", all {len(RESTORE_CHECKS)} checks pass or do not apply.")
    return f"Restoration: NOT verified ({span}): {', '.join(failed_checks(res)) or 'see Restoration'} failed — the primary needs a person."


def merged_findings(findings: list[str]) -> list[str]:
    """Findings of the form "PHASE: what" that repeat the same `what` become one line naming every
    phase; the rest stay as they are, in first-seen order."""
    groups: dict[str, list[str]] = {}
    for f in findings:
        head, sep, what = f.partition(": ")
        key = what if sep and " " not in head else f
        groups.setdefault(key, []).append(head if sep and " " not in head else "")
    out = []
    for what, phases in groups.items():
        named = [p for p in phases if p]
        if not named:
            out.append(what)
        elif len(named) == 1:
            out.append(f"{named[0]}: {what}")
        else:
            out.append(f"{what} — {len(named)} phases: {', '.join(named)}")
    return out


def caveats(r: dict) -> list[str]:
    """What qualifies the verdict: the merged findings, cells not comparable, and a rehearsal's host."""
    out = [grouped(f) for f in merged_findings((r.get("verdict") or {}).get("findings") or [])]
    # trace arms are never comparable to the replay arms, by design; other such cells are worth a caveat
    nc = [c["phase"] for c in r.get("cells", [])
          if c["status"] == "measured" and not c["comparable"] and not c["phase"].startswith("trace.")]
    if nc:
        out.append(f"not comparable to the full-prompt arms: {', '.join(nc)}")
    if r.get("rehearsal"):
        out.append("a rehearsal: the host is simulated; nothing here was measured on hardware")
    return out


REPRODUCER_WORDS = "runs the CPU reproducer on this window's own requests and its policies side by side (docs/reproducer.md)"


def reproducer_command(r: dict) -> str | None:
    """After a churn or restore-path verdict, the seed's next step as a command: the reproducer replays
    the window's own requests (a restore path that never completes shows as hits the model restores)."""
    if (r.get("verdict") or {}).get("hypothesis") not in ("row_checkpoint_churn", "restore_path"):
        return None
    return f"flare-diag reproduce LOG --window {r['window_id']} --policies lru_leaf,marconi,protect_full_prompt,block_lru"


def _pair(a: object, b: object) -> str:
    return "n/a" if a is None and b is None else f"{n(a)} / {n(b)}"


def _short_reason(c: dict) -> str:
    """The cell's reason without what the table says elsewhere: its natural output failures (the line
    under the table) and a trace arm's standing caveat."""
    why = c["reason"]
    nf = c.get("natural_failures") or 0
    if nf:
        why = why.replace(f", {nf} natural output failures recorded", "")
    return why


def _cell_row(c: dict) -> list[str]:
    h, g = c.get("host") or {}, c.get("gpu") or {}
    status = c["status"] + ("" if c["comparable"] else " · not comparable")
    return [c["phase"], status, n(c["requests"]), _pair(h.get("hits"), h.get("lookups")),
            _pair(h.get("reused_tokens"), h.get("fetched_tokens")), n(g.get("reused_tokens")), _short_reason(c)]


def _sum(cells: list[dict], part: str, key: str) -> int | None:
    vals = [(c.get(part) or {}).get(key) for c in cells]
    return None if any(v is None for v in vals) else sum(vals)  # type: ignore[arg-type]  # None excluded by the test before it


def cell_rows(r: dict) -> list[list[str]]:
    """One row per cell; the trace arms, when every one was measured, as one row (their figures are in
    the Trace section): a reason repeated twelve times is read once."""
    cells = r["cells"]
    arms = [c for c in cells if c["phase"].startswith("trace.C")]
    grouped = bool(arms) and all(c["status"] == "measured" for c in arms)
    rows = []
    for c in cells:
        if grouped and c["phase"].startswith("trace.C"):
            if c is arms[0]:
                conc = sorted({p.split(".")[1] for p in (a["phase"] for a in arms)})
                rows.append([f"trace arms ({len(arms)})", "measured · not comparable",
                             n(sum(a["requests"] for a in arms)),
                             _pair(_sum(arms, "host", "hits"), _sum(arms, "host", "lookups")),
                             _pair(_sum(arms, "host", "reused_tokens"), _sum(arms, "host", "fetched_tokens")),
                             n(_sum(arms, "gpu", "reused_tokens")),
                             f"every off/on arm at {' and '.join(conc)} measured; their timings are descriptive "
                             f"(section Trace)"])
            continue
        rows.append(_cell_row(c))
    return rows


def natural_failures_line(r: dict) -> str | None:
    """The natural output failures (kept apart from aborts), once for the whole table."""
    by: dict[int, list[str]] = {}
    for c in r["cells"]:
        if c.get("natural_failures"):
            by.setdefault(c["natural_failures"], []).append(c["phase"])
    if not by:
        return None
    parts = []
    for k, phases in sorted(by.items(), key=lambda kv: -kv[0]):
        arms = [p for p in phases if p.startswith("trace.C")]
        named = [p for p in phases if not p.startswith("trace.C")] + ([f"{len(arms)} trace arms"] if arms else [])
        parts.append(f"{k:,} in {'each of ' if len(phases) > 1 else ''}{', '.join(named)}")
    return ("Natural output failures (a request that ran out of tokens or answered nothing visible; kept apart "
            "from aborts): " + "; ".join(parts) + ".")


SCHEDULE_HEAD = ["phase", "status", "started (min)", "started (UTC)", "estimated end (min)", "ended (min)",
                 "end − estimate (min)"]


def schedule_rows(r: dict) -> list[list[str]]:
    """Each phase that started: where the estimate put its end, and where it really ended."""
    rows = []
    for c in r["cells"]:
        if c.get("started_minute") is None:
            continue
        est, end = c.get("estimated_end_minute"), c.get("ended_minute")
        rows.append([c["phase"], c["status"], num(c["started_minute"]), clock_at(r, c["started_minute"]), num(est),
                     num(end), num(end - est if end is not None and est is not None else None)])
    return rows


OCCUPANCY_HEAD = ["phase", "rows used peak / capacity (rows)", "pages used peak / capacity (pages)",
                  "records peak (records)", "stores per checkpoint kind (stores)", "evictions per pool (evictions)",
                  "compactions (count)"]


def _used(occ: dict, k: str) -> str:
    used, cap = occ.get(f"{k}_used_peak"), occ.get(f"{k}_capacity")
    if used is None:
        return "n/a"
    pct = f" ({used / cap:.0%})" if cap else ""
    return f"{n(used)} / {n(cap)}{pct}"


def _kinds(d: dict | None) -> str:
    return ", ".join(f"{k} {n(v)}" for k, v in sorted((d or {}).items())) or "n/a"


def occupancy_rows(r: dict) -> list[list[str]]:
    return [[o["phase"], _used(o, "rows"), _used(o, "pages"), n(o.get("host_cache_records_peak")),
             _kinds(o.get("stores")), _kinds(o.get("evictions")), n(o.get("compactions"))]
            for o in r.get("occupancy") or []]


LATENCY_HEAD = ["phase", "requests", "TTFT p50 (s)", "TTFT p90 (s)", "latency p50 (s)", "latency p90 (s)"]


def _trace_arm(x: dict) -> bool:
    return x["phase"].startswith("trace.C")


def _not_trace_arm(x: dict) -> bool:
    return not _trace_arm(x)  # the trace arms' figures are the Trace section's own


def _stamped(entries: list[dict]) -> tuple[int, int]:
    """How many first tokens of these latency entries the kernel's receive stamp timed, and how many their read."""
    return (sum(x.get("ttft_kernel_stamped") or 0 for x in entries),
            sum(x.get("ttft_read_stamped") or 0 for x in entries))


def latency_rows(r: dict) -> list[list[str]]:
    return [[x["phase"], n(x["requests"]), num(x["ttft_p50_s"], 2), num(x["ttft_p90_s"], 2),
             num(x["latency_p50_s"], 2), num(x["latency_p90_s"], 2)] for x in r.get("latency") or [] if _not_trace_arm(x)]


def stamp_line(r: dict) -> str | None:
    """Where the first tokens' times came from, when they crossed a network; None for a host in the
    daemon's process (a rehearsal), or a report older than the counts."""
    kernel, read = _stamped(r.get("latency") or [])
    if not kernel + read:
        return None
    line = f"First tokens timed by the kernel's receive stamp of their bytes: {kernel:,} of {kernel + read:,}."
    if read:
        line += (f" {read:,} were timed as the daemon read them (no stamp on their connection: a kernel that "
                 f"gives none, or a proxy), which a busy daemon makes later than they came.")
    return line


COST_HEAD = ["phase", "requests", "first byte p50 (s)", "first byte p90 (s)", "TTFT p50 (s)", "TTFT p90 (s)",
             "decode p50 (ms/token)", "decode p90 (ms/token)", "output p50 (tokens/s)", "output p90 (tokens/s)",
             "queue wait p50 (s, engine)", "prefill p50 (s, engine)", "host transfer (s)"]


def cost_rows(r: dict) -> list[list[str]]:
    return [[x["phase"], n(x["requests"]), num(x["first_byte_s_p50"], 3), num(x["first_byte_s_p90"], 3),
             num(x["ttft_s_p50"], 2), num(x["ttft_s_p90"], 2), num(x["decode_ms_per_token_p50"], 2),
             num(x["decode_ms_per_token_p90"], 2), num(x["output_tokens_per_s_p50"], 1),
             num(x["output_tokens_per_s_p90"], 1), _engine(x.get("engine_queue_s_p50")),
             _engine(x.get("engine_prefill_s_p50")), "not exposed" if x.get("host_transfer_s") is None
             else num(x["host_transfer_s"], 3)] for x in r.get("costs") or []]


def _engine(v: float | None) -> str:
    return "n/a" if v is None else num(v, 4)


COST_WORDS = ("Window seconds from each request's send, as the client sees them: the answer's first bytes (the host's "
              "queueing, and where an engine sends its stream's headers only with the first token, its prefill too: "
              "not a queue wait), time to first token, decode per output token after the first, and output tokens per "
              "second over the whole request; nearest-rank percentiles; descriptive. Queue wait and prefill (engine) are the "
              "engine's own per-request times, where it exports them (vLLM's request_queue_time_seconds and "
              "request_prefill_time_seconds histograms), read at C1 from their change around each request (n/a: an engine that exports neither, or a phase "
              "above C1, where one request's change cannot be told from another's); the contract has neither, nor a "
              "host-to-GPU transfer time.")
STARTING_HEAD = ["line", "the plan's starting observation", "observed", "same"]
STARTING_WORDS = {"reproduced": "REPRODUCED", "not_reproduced": "NOT reproduced", "not_measured": "not measured",
                  "not_observable": "not observable on this host"}


def starting_line(r: dict) -> str | None:
    so = r.get("starting_observation")
    if not so:
        return None
    return (f"The starting observation, against {so['phase']}: {STARTING_WORDS.get(so['status'], so['status'])}"
            + (f" ({', '.join(x['field'] for x in so['lines'] if x['same'] is False)} differ)"
               if so["status"] == "not_reproduced" else ""))


def starting_rows(r: dict) -> list[list[str]]:
    so = r.get("starting_observation") or {}
    return [[x["field"], n(x["expected"]), n(x["observed"]),
             "yes" if x["same"] else "no" if x["same"] is False else "not observed"] for x in so.get("lines") or []]


TRACE_ARM_HEAD = ["arm", "trace", "status", "requests", "host reused (tokens)", "TTFT p50 (s)", "TTFT p90 (s)",
                  "latency p50 (s)", "latency p90 (s)"]
TRACE_PAIR_HEAD = ["concurrency", "repetition", "TTFT p50 on−off (s)", "TTFT p90 on−off (s)",
                   "latency p50 on−off (s)", "latency p90 on−off (s)"]
_STATS = ("ttft_p50_s", "ttft_p90_s", "latency_p50_s", "latency_p90_s")


def trace_arm_rows(tr: dict) -> list[list[str]]:
    return [[a["phase"], a["trace"], a["status"], n(a["requests"]), n(a["host_reused_tokens"]),
             *[num(a.get(k), 2) for k in _STATS]] for a in tr.get("arms", [])]


def trace_pair_rows(tr: dict) -> list[list[str]]:
    return [[f"C{p['concurrency']}", f"r{p['repetition']}"]
            + ([num(p.get(f"{k}_on_minus_off"), 3) for k in _STATS] if p["measured"] else ["pair not measured"] * 4)
            for p in tr.get("pairs", [])]


OVERHEAD_HEAD = ["concurrency", "pairs", "median on−off TTFT (s)", "relative", "spread (s)", "95% interval", "understood"]


def overhead_rows(tr: dict) -> list[list[str]]:
    def pct(x) -> str:
        return "—" if x is None else f"{x:+.1%}"
    return [[f"C{o['concurrency']}", str(o["pairs"]), num(o.get("median_on_minus_off_s"), 3), pct(o.get("relative")),
             num(o.get("spread_s"), 3),
             "—" if not o.get("interval_relative") else f"{pct(o['interval_relative'][0])} to {pct(o['interval_relative'][1])}",
             ("yes" if o["understood"] else "no") + f": {o['why']}"] for o in tr.get("overhead", [])]


def overhead_line(tr: dict) -> str:
    rule = tr.get("overhead_rule") or {}
    return (f"Trace overhead {'understood' if tr.get('overhead_understood') else 'NOT understood'} (the plan's bounds: "
            f"median overhead at most {rule.get('overhead_max', 0.05):.0%}, interval at most "
            f"{rule.get('overhead_interval_max', 0.10):.0%} wide, at every concurrency); a capture stage is admitted "
            f"only when it is, and the cache effects are too.")


def trace_stamp_caveat(r: dict) -> str | None:
    """Said beside the trace overhead when some of its arms' first tokens were timed as the daemon read
    them: their on/off differences carry the daemon's own read delays, which no bound of the plan covers."""
    kernel, read = _stamped([x for x in r.get("latency") or [] if _trace_arm(x)])
    if not read:
        return None
    timed = kernel + read
    return (f"{read:,} of the trace arms' {timed:,} first tokens were timed as the daemon read them, not as "
            f"their bytes came: their on/off differences carry the daemon's own read delays.")


DRAIN_HEAD = ["purpose", "settled", "waited (window s)", "polls", "minute"]


def drain_rows(r: dict) -> list[list[str]]:
    return [[d["purpose"], val(d["settled"]), val(d["waited_s"]), str(d["polls"]), num(d["minute"], 2)]
            for d in r.get("drains", [])]


def fault_lines(r: dict) -> list[str]:
    """A rehearsal's injected faults, each with whether the simulated host fired it."""
    said = {True: "fired", False: "NEVER FIRED", None: "not accounted (the window did not close in this process)"}
    return [f"{f['spec']}: {said[f.get('fired')]}" for f in r.get("faults") or []]


def drain_limit_s(r: dict, bound: str) -> float | None:
    """A drain bound as the window applied it (window s): the plan's, or what a scaled clock raised it to."""
    raised = [b["effective_s"] for b in r.get("scaled_bounds") or [] if b.get("bound") == f"timing.{bound}"]
    return raised[0] if raised else (r.get("timing") or {}).get(bound)


def settle_rows(r: dict) -> list[tuple[str, float | None, bool, float | None, bool]]:
    """Per phase (and the restore's drain before readmission): (label, settled-in before it, settled, after it,
    settled); None where that drain did not run. The quiesce has its own limit and is not among them."""
    rows: dict[str, list] = {}
    for d in r.get("drains", []):
        when, _, what = d["purpose"].partition(" ")
        if when not in ("before", "after") or not what:
            continue
        row = rows.setdefault("restore: readmit" if what == "readmit" else what, [None, True, None, True])
        k = 0 if when == "before" else 2
        row[k], row[k + 1] = d["waited_s"], bool(d["settled"])
    return [(label, *v) for label, v in rows.items()]  # type: ignore[misc]  # rows hold lists of four, unpacked into the tuple


def drain_summary(r: dict) -> str:
    """The drains in one line: how many, whether all settled, the longest against its limit, and the
    resolution (a drain is seen settled only at a poll, so its time is a multiple of the poll interval)."""
    drains = r.get("drains") or []
    if not drains:
        return "no drain recorded"
    unsettled = [d["purpose"] for d in drains if not d["settled"]]
    phase = [d for d in drains if d["purpose"] != "quiesce"]
    limit, poll = drain_limit_s(r, "drain_timeout_s"), (r.get("timing") or {}).get("drain_poll_s")
    words = [f"{len(drains)} drains, " + ("all settled" if not unsettled else
                                          f"{len(unsettled)} did NOT settle ({', '.join(unsettled)})")]
    if phase:
        longest = max(phase, key=lambda d: d["waited_s"])
        words.append(f"the longest around a phase {longest['waited_s']:g} s ({longest['purpose']})"
                     + (f" of its {limit:g} s limit" if limit else ""))
    quiesce = next((d for d in drains if d["purpose"] == "quiesce"), None)
    q_limit = drain_limit_s(r, "quiesce_drain_timeout_s")
    if quiesce is not None:
        words.append(f"the quiesce {quiesce['waited_s']:g} s" + (f" of {q_limit:g}" if q_limit else ""))
    if poll:
        words.append(f"times are to the {poll:g} s poll that saw each settle")
    return "; ".join(words)


def snapshot_rows(r: dict) -> list[list[str]]:
    """The router, monitoring, GPU and configuration as first seen, as the restore saw them, and the router
    after the readmit (what verified the readmission)."""
    snaps = r.get("snapshots") or {}
    rows = []
    for when, label in (("before", "before take-down"), ("after", "in the restore, before readmission"),
                        ("readmitted", "after readmission")):
        for what, s in (snaps.get(when) or {}).items():
            rows.append([what, label, num(s.get("minute"), 2), snapshot_words(what, s.get("data") or {})])
    return rows


def snapshot_words(what: str, d: dict) -> str:
    """A snapshot in one line: the fields an operator checks, the rest by hash or count."""
    if what == "gpu":
        gpus = d.get("gpus") or []
        power = sorted({str(g.get("power_limit_w")) for g in gpus})
        mem = sum(g.get("memory_used_bytes") or 0 for g in gpus), sum(g.get("memory_total_bytes") or 0 for g in gpus)
        return (f"{len(gpus)} GPU(s), power limit {'/'.join(power) or 'n/a'} W, memory used {mem[0] / 2**30:.1f} of "
                f"{mem[1] / 2**30:.1f} GiB, {len(d.get('xid_events') or [])} Xid event(s)")
    if what == "router":
        b = d.get("backend") or {}
        return (f"backend {b.get('id')} admitted {val(b.get('admitted'))}, in flight {val(b.get('inflight'))}; "
                f"config sha256 {str(d.get('config_sha256'))[:12]}")
    if what == "monitoring":
        t = d.get("target") or {}
        return f"target {t.get('id')} registered {val(t.get('registered'))}, healthy {val(t.get('healthy'))}"
    if what == "configuration":
        return f"site {d.get('site')} (sha256 {str(d.get('site_sha256'))[:12]}), plan sha256 {str(d.get('plan_sha256'))[:12]}"
    return ", ".join(f"{k} {v}" for k, v in d.items())[:200]


def failure_cells(f: dict) -> list[str]:
    """One natural failure as a table row: phase, order, body, kind."""
    return [f["phase"], str(f["order_index"]), str(f["body_index"]), f["kind"]]


def natural_failure_rows(r: dict) -> list[list[str]]:
    """Natural output failures collapsed per phase: the count of each kind."""
    per = getattr(r, "failure_kinds", None)  # a projected report counted them (its rows may be in a spool)
    if per is None:
        per = {}
        for f in r.get("natural_failures") or []:
            kinds = per.setdefault(f["phase"], {})
            kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    return [[ph, n(sum(k.values())), ", ".join(f"{kind} {count:,}" for kind, count in k.items())] for ph, k in per.items()]


def check(v: object) -> str:
    return {True: "pass", False: "FAIL", None: "not applicable"}.get(v, str(v))  # type: ignore[call-overload]  # a bool or None key; any other value falls to str(v)


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


def audit_words(it: dict) -> str:
    """The audit in a word or three: ok, DIVERGED (a decision differs under the policy that made it), or
    not replayed (decided by another policy version, which this build decides differently)."""
    if it.get("audit_ok", True):
        return "ok"
    return "DIVERGED" if _diverged(it) else "not replayed (another policy version)"


def _diverged(it: dict) -> bool:
    """A decision of the log differs under the policy that made it (this window's or another's)."""
    return bool(it.get("audit_problem")) or (not it.get("audit_ok", True) and not it.get("audit_policy"))


def integrity_problem(it: dict) -> str | None:
    """Why a report's log is no evidence (its chain, or a decision that differs under its own policy); None
    when it is, a window not replayed by this build included (its report says so)."""
    if not it.get("chain_ok", True):
        return f"the chain does not verify ({it.get('problem') or 'see Integrity'})"
    if _diverged(it):
        return f"replayed decisions differ ({it.get('audit_problem') or 'see Integrity'})"
    return None


# alarms that forecast rather than observe: the window acts on the forecast itself (it defers what will
# not fit), so one is a person's business only where the forecast came true and cost a required cell
FORECASTS = frozenset({"projected_overrun"})


def forecast_only(r: dict, alarm: dict) -> bool:
    """A forecast that changed nothing: every required cell was measured, or an abort ended the window."""
    return alarm.get("kind") in FORECASTS and r.get("outcome") != "partial"


def alarm_line(r: dict, alarm: dict) -> str:
    """An alarm as the report lists it; a forecast that changed nothing says so, and no more than is known (a
    window that aborted, or is still open, ended before the forecast could come true or not)."""
    said = f"{alarm['kind']}: {alarm['detail']}"
    if not forecast_only(r, alarm):
        return said
    if r.get("outcome") == "completed":
        return said + " (a forecast: it did not come true, no required cell was lost to time)"
    ended = f"ended {r['outcome']}" if r.get("outcome") else "is still open"
    return said + f" (a forecast: the window {ended} before it could come true or not)"


def needs_attention(r: dict) -> list[str]:
    """What a person must act on, for the top of every format: a restoration that did not verify
    (with the checks that failed) and every alarm."""
    res = r.get("restoration") or {}
    out = []
    if res and not res.get("verified"):
        failed = failed_checks(res)
        out.append(f"restoration NOT verified: {', '.join(failed) or 'see Restoration'} failed")
    out += [f"alarm {a['kind']}: {a['detail']}" for a in r.get("alarms") or [] if not forecast_only(r, a)]
    out += [f"FAULT NEVER FIRED: {f['spec']} was injected and the window never met it, so this rehearsal tested "
            f"nothing of it" for f in r.get("faults") or [] if f.get("fired") is False]
    out += [f"PRESERVED HISTORY CHANGED: {p['path']} (sha256 {str(p['sha256_before'])[:12]} before the window, "
            f"{str(p['sha256_after'])[:12] if p['sha256_after'] else 'missing'} after publishing)"
            for p in r.get("preserved") or [] if p.get("unchanged") is False]
    out += [f"bound raised by the scaled clock: {b['bound']} held at {b['effective_s']:g} window s, not the plan's "
            f"{b['plan_s']:g} ({b['reason']})" for b in r.get("scaled_bounds") or []]
    out += [f"OUTPUTS CHANGED UNDER REUSE in {c['phase']}: {c['reason']}" for c in r.get("cells") or []
            if (c.get("consistency") or {}).get("differ")]
    it = r.get("integrity") or {}
    if it and not it.get("chain_ok"):  # nothing below can be trusted: say so first
        out.insert(0, f"LOG INTEGRITY FAILED: the chain does not verify ({it.get('problem') or 'see Integrity'})")
    if it.get("audit_policy"):  # the decisions stand as recorded, unconfirmed by this build
        out.insert(0, f"DECISIONS NOT REPLAYED: {it['audit_policy']}")
    if _diverged(it):
        out.insert(0, f"LOG AUDIT FAILED: replayed decisions differ ({it.get('audit_problem') or 'see Integrity'})")
    return out


REQUEST_COLUMNS = ("phase", "order", "body sha256", "prompt (tokens)", "completion (tokens)", "cached (tokens)",
                   "finish", "visible", "first token (window s)", "end (window s)", "host lookups (requests)",
                   "host hits (requests)", "host fetched (tokens)", "host reused (tokens)", "GPU reused (tokens)",
                   "outcome")
WALL_COLUMN = "end (wall s)"


def request_columns(r: dict) -> tuple[str, ...]:
    """A window whose clock runs faster than the wall's shows the wall time beside the window's."""
    if is_virtual(r) or scale_of(r) == 1:
        return REQUEST_COLUMNS
    i = REQUEST_COLUMNS.index("end (window s)") + 1
    return REQUEST_COLUMNS[:i] + (WALL_COLUMN,) + REQUEST_COLUMNS[i:]


# a request row's keys the table reads, fetched in one call each (itemgetter) for the row of an
# answered request; a row without its answer lacks most of them and is read key by key
_ROW_KEYS = ("phase", "order_index", "body_sha256", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason",
             "visible_output", "reasoning_only", "first_token_ns", "end_ns", "outcome", "natural_failure", "delta")
_DELTA_KEYS = ("host_lookups", "host_hits", "host_fetched_tokens", "host_reused_tokens", "gpu_reused_tokens")
_row_items, _row_attrs = itemgetter(*_ROW_KEYS), attrgetter(*_ROW_KEYS)
_delta_values, _delta_attrs = itemgetter(*_DELTA_KEYS), attrgetter(*_DELTA_KEYS)
_G3 = [f"{i:03}" for i in range(1000)]  # the last three digits of a grouped count
# A count's cell by its value: a window's counts repeat (the default rehearsal's 336 rows hold 123
# distinct counts: 52 bodies' prompts, block-sized cache deltas), and a dict lookup is a third of
# formatting one. Ints only (1717.0 == 1717 would share a key). Bounded: 6.4 MB of cells when full,
# kept by a daemon between reports. A miss costs more than formatting alone, so it is sized for a
# window of millions of events, whose counts run to tens of thousands of values (bench/report.py:
# 4,096 entries made the report slower at 4M events, 65,536 faster).
_COUNT_CELLS: dict[int, str] = {}
_COUNT_CELLS_MAX = 1 << 16


def _count_cell(a) -> str:
    """A count's cell when `_COUNT_CELLS` lacks it: grouped by thousands (a grouping format spec costs
    three plain formats under callgrind, the table of three-digit groups a third of that)."""
    if a is None:
        return "n/a"
    cell = f"{a}" if -1000 < a < 1000 else f"{a // 1000},{_G3[a % 1000]}" if 0 < a < 1_000_000 and type(a) is int else f"{a:,}"
    if type(a) is int and len(_COUNT_CELLS) < _COUNT_CELLS_MAX:
        _COUNT_CELLS[a] = cell
    return cell


def request_row(q, scale: float = 1.0, wall: bool = False) -> tuple[str, ...]:
    """A request row's table cells; `q` is the row as report.json holds it (a dict) or as a projection
    makes it for a spool (events/report.RequestRow)."""
    # called once per request (md and html share the cells): it dominates the rendering of long
    # reports, so the values come out in two C calls and the cells are f-strings (no call each)
    if type(q) is not dict:
        ph, o, sha, a, b, c, f, vis, ro, ft, end, out, nf, d = _row_attrs(q)
    else:
        try:
            ph, o, sha, a, b, c, f, vis, ro, ft, end, out, nf, d = _row_items(q)
        except KeyError:
            ph, o, sha, a, b, c, f, vis, ro, ft, end, out, nf, d = map(q.get, _ROW_KEYS)
    try:
        lk, hi, fe, re_, gr = _delta_values(d) if type(d) is dict else _delta_attrs(d)  # a RequestRow's may be its view
    except (KeyError, TypeError, AttributeError):
        lk, hi, fe, re_, gr = map((d or {}).get, _DELTA_KEYS)
    # counts grouped by thousands, from _COUNT_CELLS when seen before (a delta may be a float, a
    # counter as Prometheus text gives it: _count_cell formats those)
    cells_of = _COUNT_CELLS.get
    head = (ph, f"{o}", sha[:12],
            (type(a) is int and cells_of(a)) or _count_cell(a),
            (type(b) is int and cells_of(b)) or _count_cell(b),
            (type(c) is int and cells_of(c)) or _count_cell(c),
            "n/a" if f is None else f"{f}",
            "yes" if vis else ("reasoning only" if ro else "no"),
            "n/a" if ft is None else f"{ft * scale / 1e9:.3f}", "n/a" if end is None else f"{end * scale / 1e9:.3f}")
    tail = ((type(lk) is int and cells_of(lk)) or _count_cell(lk),
            (type(hi) is int and cells_of(hi)) or _count_cell(hi),
            (type(fe) is int and cells_of(fe)) or _count_cell(fe),
            (type(re_) is int and cells_of(re_)) or _count_cell(re_),
            (type(gr) is int and cells_of(gr)) or _count_cell(gr),
            out + (f" ({nf})" if nf else ""))
    if wall:
        return head + ("n/a" if end is None else f"{end / 1e9:.3f}",) + tail
    return head + tail


def request_rows(r: dict) -> list[tuple[str, ...]]:
    """Every request's table cells in report order (the phase first); md and html tables share them."""
    scale, wall = scale_of(r), len(request_columns(r)) != len(REQUEST_COLUMNS)
    return [request_row(q, scale, wall) for q in r.get("requests", [])]


CONSISTENCY_HEAD = ("phase", "bodies compared", "reused on the warm pass", "answered differently", "finding")
CONSISTENCY_DIFF_HEAD = ("phase", "body", "cold answer (sha256)", "warm answer (sha256)", "warm pass reused")


def consistency_rows(r: dict) -> tuple[list[list[str]], list[list[str]]]:
    """(one row per consistency phase, one row per body answered differently) for every format."""
    rows, diffs = [], []
    for c in r.get("cells") or []:
        res = c.get("consistency")
        if res is None:
            continue
        finding = ("INCONSISTENT" if res["differ"] else "consistent" if res.get("consistent") and res["reused_warm"]
                   else "reuse not observable" if res.get("reuse_untold") else "not exercised")
        rows.append([c["phase"], f"{res['compared']:,}", f"{res['reused_warm']:,}", f"{len(res['differ']):,}", finding])
        diffs += [[c["phase"], f"#{d['body_index']}", d["cold_sha256"][:16], d["warm_sha256"][:16],
                   {True: "yes", False: "no"}.get(d["reused"], "not observable")] for d in res["differ"]]
    return rows, diffs


CONSISTENCY_WORDS = ("Greedy bodies (temperature 0) sent cold on a fresh incarnation, then again with the host's reuse; "
                     "a cached state must not change an answer. An inconsistent build fails correctness whatever its "
                     "latency.")


GUARD_HEAD = ("guard", "breaches when", "consecutive", "guards", "before quiesce", "during: evaluations",
              "during: breaches", "after readmission", "mode")


def _guard_value(points: list[dict]) -> str:
    if not points:
        return "not evaluated"
    p = points[-1]
    if p.get("value") is None:
        return "no number" + (f" ({p['error']})" if p.get("error") else "")
    return f"{p['value']:.4g}" + (" BREACHED" if p.get("breach") else " holds")


def guard_rows(r: dict) -> list[list[str]]:
    """One row per steady-state guard: its rule, and what it read before, during and after the window."""
    rows = []
    for g in (r.get("steady_state") or {}).get("guards", []):
        by = {w: [p for p in g["series"] if p["when"] == w] for w in ("before", "during", "after")}
        rows.append([g["name"], f"{g['breach_if']} {g['threshold']:g}", str(g.get("consecutive")), str(g.get("during")),
                     _guard_value(by["before"]), f"{len(by['during']):,}",
                     f"{sum(1 for p in by['during'] if p['breach']):,}", _guard_value(by["after"]),
                     "dry run (logged, never aborts)" if g.get("dry_run") else "enforced"])
    return rows


def guard_points(g: dict) -> list[tuple[float, float, bool]]:
    """A guard's evaluations with a number, as (minute, value, breached): before the quiesce at minute 0."""
    return [(p["minute"] if p["minute"] is not None else 0.0, p["value"], bool(p["breach"]))
            for p in g["series"] if p.get("value") is not None]


STEADY_WORDS = ("Each guard is a PromQL query on the site's Prometheus, evaluated before the quiesce, every interval "
                "while the window runs, and after the readmission; its consecutive breaches abort the experiment "
                "(steady_state), or raise an alarm during the restore. A dry-run guard is evaluated and logged and "
                "never aborts.")


def abort_words(a: dict) -> str:
    """An abort's detail, and who asked for it when a person did (uid and pid from the control socket)."""
    who = [f"{k} {a[k]}" for k in ("uid", "pid") if a.get(k) is not None]
    return (f"asked by {', '.join(who)}: " if who else "") + str(a.get("detail", ""))


def identity_lines(r: dict) -> list[tuple[str, str, bool]]:
    """The identity as (who, what, differs): the expected fields once, then each run of reads as one line,
    "as expected" when every expected field it read matched, else only the fields that differ, each with
    the value expected and the value found (a 13-column table was unreadable in a terminal)."""
    exp = (r.get("identity") or {}).get("expected") or {}
    out = [("expected", ", ".join(f"{k} {n(v)}" for k, v in exp.items()) or "nothing", False)]
    for label, o in identity_columns(r):
        mism = o.get("mismatches") or []
        if not mism:
            read = sum(1 for k in exp if k in o["identity"])
            out.append((label, f"as expected ({read} of {len(exp)} fields read)", False))
            continue
        diffs = "; ".join(f"{k} expected {n(exp.get(k))}, found {n(o['identity'].get(k))}" for k in mism)
        out.append((label, f"DIFFERS in {len(mism)} of {len(exp)} fields: {diffs}", True))
    return out


def identity_columns(r: dict) -> list[tuple[str, dict]]:
    """The identity observations as runs: reads that saw the same identity under one label are one run
    ("incarnation A (52 reads, minutes 1.1-15.0)"), so a window that reads its identity between every
    request does not grow a line per request. The trace switch alone does not end a run (the trace arms turn
    it on and off on one incarnation): the run's label counts its changes instead."""
    runs: list[tuple[list[dict], dict]] = []
    for o in (r.get("identity") or {}).get("observed", []):
        last = runs[-1][1] if runs else None
        if last is not None and last["label"] == o["label"] and last["mismatches"] == o["mismatches"] \
                and _sans_trace(last["identity"]) == _sans_trace(o["identity"]):
            runs[-1][0].append(o)
        else:
            runs.append(([o], o))
    return [(_run_label(run, o), o) for run, o in runs]


def _sans_trace(identity: dict) -> dict:
    return {k: v for k, v in identity.items() if k != "trace_enabled"}


def _run_label(run: list[dict], o: dict) -> str:
    """A run's label: how many reads, over which minutes, and how often the trace switch changed in it."""
    switches = sum(1 for a, b in zip(run, run[1:]) if a["identity"].get("trace_enabled") != b["identity"].get("trace_enabled"))
    if len(run) == 1:
        return o["label"]
    ms = [x["minute"] for x in run if x.get("minute") is not None]
    lo, hi = (num(min(ms)), num(max(ms))) if ms else ("", "")
    span = "" if not ms else f", minute {lo}" if lo == hi else f", minutes {lo}-{hi}"
    trace = f"; trace_enabled changed {switches} time{'s' * (switches != 1)}" if switches else ""
    return f"{o['label']} ({len(run):,} reads{span}{trace})"
