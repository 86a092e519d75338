"""The window report (contract section 4, schema flare-diag.report/1) as a pure fold over the log.

The same events always give the same report: nothing here reads a clock, a file or the
environment, and every collection is emitted in log order.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgspec
import msgspec.structs

from flare_diag.events.base import BadEventError, registered_type
from flare_diag.events.envelope import Envelope, ReadEvent
from flare_diag.events.schema import (
    ActionRequested,  # noqa: F401  (registers the types the views read)
    window_minute,
)
from flare_diag.events.stages import Stage
from flare_diag.events.window_fold import WindowFold

SCHEMA = "flare-diag.report/1"
Read = Envelope | ReadEvent  # a projection reads either: a log's narrowed rows, or every envelope of a copy of it
HOST_COUNTERS = ("host_lookups", "host_hits", "host_fetched_tokens", "host_reused_tokens")
GPU_COUNTERS = ("gpu_hits", "gpu_reused_tokens")
SERIES_KEYS = HOST_COUNTERS + GPU_COUNTERS
# an engine's own per-request times, as _sum and _count counters (daemon/hosts/metrics.py TIMINGS)
ENGINE_TIMING_KEYS = ("engine_queue_s_sum", "engine_queue_s_count", "engine_prefill_s_sum", "engine_prefill_s_count")
SNAPSHOTS = ("router", "monitoring", "gpu", "configuration")
# gauges whose peak (or capacity) per phase is the seed's allocation-capacity-against-live-occupancy evidence
OCCUPANCY_GAUGES = ("rows_used", "rows_capacity", "pages_used", "pages_capacity", "host_cache_records",
                    "host_cache_bytes_used", "host_cache_bytes_capacity", "host_cache_tokens_used",
                    "host_cache_tokens_capacity")


class Report(dict[str, Any]):
    """report.json's dict, and beside it (never serialized) what a renderer needs from the
    per-request parts when the report was projected without them (into a spool): the host reuse of
    each replayed request, the counter chart's points and the natural failures per phase."""

    reuse_panels: dict[str, list[tuple[int, int]]] | None = None
    counter_points: dict[str, list[tuple[float, float]]] | None = None
    failure_kinds: dict[str, dict[str, int]] | None = None
    spool = None  # the ReportSpool holding the request rows, counter series and natural failures


# the counters the report charts, fetched first so that reused is drawn dashed over it
CHARTED_COUNTERS = ("host_fetched_tokens", "host_reused_tokens", "gpu_reused_tokens")


# the phases whose per-request host reuse the report charts (the replay arms of incarnations A and B)
REPLAY_PREFIXES = ("A.", "B.")


class _Projection:
    """One pass over a window's events: the shared window fold, plus what only the report shows
    (request rows, counter series, identity observations, recipes, drains)."""

    def __init__(self, window_id: str, integrity: dict[str, Any], spool: Any = None) -> None:
        """`spool` (daemon/reports/report_spool.py): takes each request row, scrape and natural failure as it
        is made, in place of the report's lists, which then stay empty."""
        self.spool = spool
        self.failure_kinds: dict[str, dict[str, int]] = {}
        self.samples: dict[str, _Samples] = {}  # per phase: what the descriptive statistics read
        self.reuse: dict[str, list[tuple[int, int]]] = {}  # replay phase -> (order, host reused tokens)
        # phase -> (queue, prefill) seconds per request, as the engine itself timed them (C1 only)
        self.engine_times: dict[str, tuple[list[float], list[float]]] = {}
        self.fold = WindowFold(window_id)
        self.integrity = integrity
        self.r: dict[str, Any] = {"identity": {"observed": [], "incumbent_sha256_before": None, "incumbent_sha256_after": None},
                        # exact recipe bytes retained before take-down (role -> name, sha256, size, where)
                        "recipes": {},
                        "requests": [], "natural_failures": [], "drains": [],
                        "counters": {"minute": [], **{k: [] for k in SERIES_KEYS}},
                        # the router, monitoring, GPU and configuration as first seen, and as seen in the restore
                        "snapshots": {"before": {}, "after": {}, "readmitted": {}},
                        "occupancy": []}
        self.occupied: dict[str, Any] | None = None  # the open phase's peak gauges, from the scrapes taken during it
        self.actions: dict[int, tuple[str, dict[str, Any]]] = {}
        self.responses: dict[tuple[str, int], Any] = {}  # a request_done or its narrow view, by (phase, order)
        self.load_label = "incumbent before take-down"
        self.steady: dict[str, Any] = {"guards": {}}  # guard name -> its declaration and its evaluations
        self.readmitted_at: int | None = None
        self.operator: dict[str, Any] | None = None  # who sent the operator abort (uid, pid), as the control socket saw

    def minute(self, at_ns: int) -> float | None:
        return self.fold.minute_at(at_ns)

    def apply(self, env: Read, entry: tuple[Any, ...]) -> None:
        """`env` through its type's entry of _DISPATCH (its handler, narrow view, input flag, view version)."""
        handler, light, is_input, version = entry
        # The events a long window is made of are read through narrow views (only the fields this
        # report uses); an event of an older schema version goes through its upcaster instead.
        if light is not None and env.schema_v == version:
            try:
                ev = light.decode(env.payload)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # as env.event() says it, for a full decode
                raise BadEventError(f"seq {env.seq} ({env.type}): its stored bytes do not decode ({exc})") from None
        else:
            ev = env.event()
        if is_input:
            self.fold.saw_input(ev.at_ns)
        if handler is None:
            self.fold.apply(env.seq, ev, env.wall_ns)
        else:
            handler(self, env, ev)

    def _engine_times(self, phase: str, timing: tuple[Any, ...]) -> None:
        """One request's queue and prefill seconds from the changes of the engine's histograms around it:
        only where each count moved by exactly one (this request's own observation, and no other's)."""
        queue_sum, queue_n, prefill_sum, prefill_n = timing
        queue, prefill = self.engine_times.setdefault(phase, ([], []))
        if queue_n == 1 and queue_sum is not None:
            queue.append(queue_sum)
        if prefill_n == 1 and prefill_sum is not None:
            prefill.append(prefill_sum)

    # --- inputs ---------------------------------------------------------------------------

    def action_done(self, env: Read, ev: Any) -> None:
        # a decision not seen is a scrape's: a reader may leave those out (UNREAD_ACTIONS), and every
        # other decision but a send's (answered by its request_done) is recorded when it is read
        action, args = self.actions.pop(ev.action_id, _SCRAPE)
        if not ev.ok or action not in _ANSWERS_READ:
            return
        if type(ev) is _ScrapeDoneView and action != "scrape_metrics":
            ev = _done.decode(env.payload)  # read as a scrape's answer, but another's: its data as stored
        if action == "readmit":
            self.readmitted_at = ev.at_ns  # the guards' evaluations from here on are the pool after the window
            return
        if action == "steady_state":
            d = msgspec.json.decode(ev.data) if isinstance(ev.data, msgspec.Raw) else ev.data
            self._guard_values(ev.at_ns, d.get("when") or args.get("when") or "", d.get("guards") or {})
            return
        if action == "scrape_metrics":
            self._scraped(ev)
            return
        d = msgspec.json.decode(ev.data) if isinstance(ev.data, msgspec.Raw) else ev.data
        if action == "retain_recipe":
            self.r["recipes"][args.get("role") or d.get("recipe")] = {
                "recipe": d.get("recipe"), "sha256": d.get("sha256"), "bytes": d.get("bytes"), "path": d.get("path")}
        elif action == "preview" and args.get("role") == "rollback":
            self.r["recipes"]["rollback"] = {"recipe": args.get("recipe"), "sha256": args.get("sha256"),
                                             "preview": list(d.get("steps") or [])}
        elif action == "snapshot" and args.get("what") == "incumbent":
            self.r["identity"]["incumbent_sha256_before"] = d.get("sha256")
            self._observed("incumbent before take-down", env, {**(d.get("identity") or {}),
                                                               "recipe_sha256": d.get("sha256"), "recipe": d.get("recipe")})
        elif action == "snapshot" and args.get("what") in SNAPSHOTS:
            # the restore's checks before the readmit, and the router's own view after it (the readmission verified)
            when = "before" if self.fold.stage != Stage.RESTORE else "after" if self.readmitted_at is None else "readmitted"
            if when != "before" or args["what"] not in self.r["snapshots"]["before"]:
                self.r["snapshots"][when][args["what"]] = {"minute": self.minute(ev.at_ns), "data": d}
        elif action == "read_identity":
            self._observed(self.load_label, env, d)
            if self.fold.stage == Stage.RESTORE:
                self.r["identity"]["incumbent_sha256_after"] = d.get("recipe_sha256")

    def _scraped(self, ev: Any) -> None:
        """A scrape's counters onto the window's series (or its spool) and its gauges onto the open phase's occupancy."""
        if type(ev) is _ScrapeDoneView:
            values = msgspec.structs.astuple(ev.data.counters)
            gauges = msgspec.structs.astuple(ev.data.gauges)
        elif isinstance(ev.data, msgspec.Raw):
            try:
                scrape = _scrape.decode(ev.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise BadEventError(f"a scrape's stored bytes do not decode ({exc})") from None
            values = msgspec.structs.astuple(scrape.counters)
            gauges = msgspec.structs.astuple(scrape.gauges)
        else:
            c = ev.data.get("counters") or {}
            values = tuple(c.get(k) for k in SERIES_KEYS)
            g = ev.data.get("gauges") or {}
            gauges = tuple(g.get(k) for k in OCCUPANCY_GAUGES)
        if self.occupied is not None:
            self._occupy(self.occupied, gauges)
        m = window_minute(ev.at_ns, self.fold.t0_ns)
        if self.spool is not None:
            self.spool.scrape(m, values)
            return
        series = self.r["counters"]  # columnar: one list per counter, aligned with "minute"
        series["minute"].append(m)
        for k, v in zip(SERIES_KEYS, values):
            series[k].append(v)

    def _occupy(self, occ: dict[str, Any], gauges: tuple[Any, ...]) -> None:
        """The open phase's occupancy (`occ`) from one scrape's gauges (OCCUPANCY_GAUGES order)."""
        occ["scrapes"] += 1
        if gauges == _NO_GAUGES:
            return
        for k, v in zip(OCCUPANCY_GAUGES, gauges):
            if v is None:
                continue
            if k.endswith("_capacity"):
                occ[k] = v
            else:
                occ[f"{k}_peak"] = max(occ.get(f"{k}_peak") or 0, v)
                occ[f"{k}_last"] = v  # the latest reading: after the closing drain, what the phase left

    def window_opened(self, env: Read, ev: Any) -> None:
        self.fold.apply(env.seq, ev, env.wall_ns)
        self.steady["guards"] = {g["name"]: {**{k: g.get(k) for k in ("name", "query", "breach_if", "threshold",
                                                                       "consecutive", "interval_s", "during", "dry_run")},
                                             "series": []}
                                 for g in self.fold.guards if isinstance(g.get("name"), str)}

    def phase_started(self, env: Read, ev: Any) -> None:
        self.fold.apply(env.seq, ev, env.wall_ns)
        self.occupied = {"phase": ev.phase, "scrapes": 0}

    def cell_recorded(self, env: Read, ev: Any) -> None:
        self.fold.apply(env.seq, ev, env.wall_ns)
        if self.occupied is None or self.occupied["phase"] != ev.phase:
            return
        occ, self.occupied = self.occupied, None
        if ev.requests == 0:  # an identity phase: nothing was stored
            return
        c = ev.counters or {}
        occ["stores"] = {k.split(".", 1)[1]: v for k, v in c.items() if k.startswith("stores.")}
        occ["evictions"] = {k.split(".", 1)[1]: v for k, v in c.items() if k.startswith("evictions.")}
        occ["compactions"] = c.get("compactions")
        self.r["occupancy"].append(occ)

    def _observed(self, label: str, env: Read, ident: dict[str, Any]) -> None:
        gpus = ident.get("gpus")
        if isinstance(gpus, list) and gpus and all(isinstance(g, dict) for g in gpus):
            # the plan names a GPU count and power limit; the identity carries the GPUs themselves
            limits = sorted({g.get("power_limit_w") for g in gpus}, key=str)
            ident = {**ident, "gpu_count": len(gpus), "gpu_power_limit_w": limits[0] if len(limits) == 1 else limits}
        exp = self.fold.expected_identity
        mism = [k for k in exp if k in ident and ident.get(k) != exp[k]]
        self.r["identity"]["observed"].append({"label": label, "minute": self.minute(self.fold.last_at_ns),
                                               "identity": ident, "mismatches": mism})

    def request_done(self, env: Read, ev: Any) -> None:
        self.responses[(ev.phase, ev.order_index)] = ev  # joined to its measurement when that comes

    # --- decisions ------------------------------------------------------------------------

    def action_requested(self, env: Read, ev: Any) -> None:
        action = ev.request.action if isinstance(ev, _ActionView) else ev.action
        if action == "send_request":  # answered by its request_done
            return
        if action in _ARGS_READ:  # the few whose arguments the report shows, decoded in full
            full: Any = env.event() if isinstance(ev, _ActionView) else ev
            args = full.args
        else:
            args = {}
        self.actions[ev.action_id] = (action, args)
        self.fold.saw_action(action)
        if action == "load":
            self.load_label = "incumbent after restore" if args.get("label") == "incumbent" \
                else f"incarnation {args.get('label')}"

    def request_measured(self, env: Read, ev: Any) -> None:
        self.fold.count_request()
        # the narrow view's struct encodes as the dict of its keys would (every key, in order), so an
        # answered request's row keeps it; a row that is a dict, or a report held whole, gets the dict
        full = ev.delta
        d: Any  # the counter deltas: the narrow view's struct, or a dict
        req: dict[str, Any] | RequestRow
        if isinstance(full, _MeasuredDelta):
            values = msgspec.structs.astuple(full)
            d = _DeltaView(*values[:len(SERIES_KEYS)])
            timing = values[len(SERIES_KEYS):]
        else:
            d = {k: full.get(k) for k in SERIES_KEYS}
            timing = tuple(full.get(k) for k in ENGINE_TIMING_KEYS)
        if ev.outcome == "ok" and any(t is not None for t in timing):  # an engine may export one and not the other
            self._engine_times(ev.phase, timing)
        rd = self.responses.pop((ev.phase, ev.order_index), None)
        if rd is None:
            req = {"phase": ev.phase, "order_index": ev.order_index, "body_index": ev.body_index,
                   "body_sha256": ev.body_sha256, "outcome": ev.outcome, "natural_failure": ev.natural_failure,
                   "delta": _delta_dict(d)}
        else:
            req = RequestRow(ev.phase, ev.order_index, ev.body_index, ev.body_sha256, ev.outcome, ev.natural_failure,
                             d, rd.finish_reason, rd.visible_output, rd.reasoning_only, rd.prompt_tokens,
                             rd.completion_tokens, rd.cached_tokens, rd.first_byte_ns, rd.first_token_ns,
                             rd.last_token_ns, rd.end_ns, rd.response_bytes, rd.response_sha256, rd.error,
                             window_minute(rd.at_ns, self.fold.t0_ns), rd.first_token_stamp)
        if ev.outcome == "ok":
            smp = self.samples.get(ev.phase)
            if smp is None:
                smp = self.samples[ev.phase] = _Samples()
            smp.add(rd)
        if ev.phase.startswith(REPLAY_PREFIXES):
            v = d.get("host_reused_tokens") if type(d) is dict else d.host_reused_tokens
            if v is not None:
                self.reuse.setdefault(ev.phase, []).append((ev.order_index, v))
        if self.spool is None:
            self.r["requests"].append(req if isinstance(req, dict) else {**msgspec.structs.asdict(req), "delta": _delta_dict(d)})
        else:
            self.spool.request(req, self.fold.clock)
        if ev.natural_failure:
            f = {"phase": ev.phase, "order_index": ev.order_index, "body_index": ev.body_index, "kind": ev.natural_failure}
            kinds = self.failure_kinds.setdefault(ev.phase, {})
            kinds[ev.natural_failure] = kinds.get(ev.natural_failure, 0) + 1
            if self.spool is None:
                self.r["natural_failures"].append(f)
            else:
                self.spool.natural_failure(f)

    def operator_abort(self, env: Read, ev: Any) -> None:
        if self.operator is None:  # the first one aborted; a later one found the window restoring
            self.operator = {"uid": ev.uid, "pid": ev.pid}

    def watch_observed(self, env: Read, ev: Any) -> None:
        if ev.source != "prometheus":
            return
        d = msgspec.json.decode(ev.data) if isinstance(ev.data, msgspec.Raw) else ev.data
        after = self.readmitted_at is not None and ev.at_ns >= self.readmitted_at
        self._guard_values(ev.at_ns, "after" if after else "during", {d.get("guard"): d})

    def _guard_values(self, at_ns: int, when: str, answers: dict[str, Any]) -> None:
        """Each guard's evaluations: minute, value (the one it is judged on), when (before the quiesce,
        during the window, after the readmission), and whether it breached."""
        guards = self.steady["guards"]
        for name, a in answers.items():
            g = guards.get(name)
            if g is None or not isinstance(a, dict):
                continue
            vals = [v for v in a.get("values") or [] if isinstance(v, (int, float)) and math.isfinite(v)]
            value = (max(vals) if g["breach_if"] in (">", ">=") else min(vals)) if vals else None
            t = g["threshold"]
            breach = value is not None and {">": value > t, ">=": value >= t, "<": value < t, "<=": value <= t}[g["breach_if"]]
            g["series"].append({"minute": self.minute(at_ns), "when": when, "value": value, "breach": breach,
                                **({"error": a["error"]} if a.get("error") else {})})

    def drain_observed(self, env: Read, ev: Any) -> None:
        self.r["drains"].append({"purpose": ev.purpose, "settled": ev.settled, "waited_s": ev.waited_s,
                                 "polls": ev.polls, "minute": ev.minute})

    def finish(self) -> Report:
        f = self.fold
        r = Report({"schema": SCHEMA, "window_id": f.window_id, "plan": f.plan or None, "t0_wall": f.t0_wall,
             "outcome": f.outcome, "abort": f.abort, "cells": list(f.cells.values()), "verdict": f.verdict,
             "restoration": f.restoration if f.restoration is None else {**f.restoration, "host_changed": f.host_changed},
             "integrity": self.integrity, "timeline": f.timeline,
             "identity": {"expected": f.expected_identity, **self.r["identity"], "candidate_recipe": f.candidate_recipe},
             **{k: self.r[k] for k in ("recipes", "requests", "natural_failures", "drains", "counters")},
             "alarms": f.alarms, "scaled_bounds": f.scaled_bounds, "review": f.review or None, "faults": f.faults,
             "harness": f.harness or None, "harness_fitted": f.harness_fitted or None, "preserved": list(f.preserved.values()), "trace": {"order": f.trace_order}, "timing": f.timing, "site": f.site,
             "rehearsal": f.rehearsal, "clock": f.clock, "plan_sha256": f.plan_sha256,
             "snapshots": self.r["snapshots"], "occupancy": self.r["occupancy"]})
        if self.spool is not None:  # what the renderers would otherwise read from the lists in the spool
            self.spool.finish()
            r.spool = self.spool
            r.reuse_panels = self.reuse
            r.counter_points = self.spool.counter_points()
            r.failure_kinds = self.failure_kinds
        scale = float(f.clock.get("time_scale") or 1.0)
        r["trace"].update(trace_evidence(r["cells"], self.samples, scale))
        r["trace"].update(trace_overhead(r["trace"]["arms"], r["trace"]["pairs"], f.trace_rule))
        r["latency"] = phase_latency(self.samples, scale)
        r["costs"] = phase_costs(self.samples, scale, self.engine_times)
        so = f.starting_observation
        r["starting_observation"] = starting_observation(so, f.cells, r["occupancy"]) if so else None
        if r["abort"] and r["abort"].get("reason") == "operator" and self.operator:
            r["abort"] = {**r["abort"], **{k: v for k, v in self.operator.items() if v is not None}}
        if self.steady["guards"]:  # only a plan with guards has the section (other reports keep their bytes)
            r["steady_state"] = {"evaluated": f.steady_state, "guards": list(self.steady["guards"].values())}
        return r


def _pct(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile: a value that was observed, the same on every machine."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(-(-len(s) * q // 100)) - 1))]


TRACE_STATS = ("ttft_p50_s", "ttft_p90_s", "latency_p50_s", "latency_p90_s")


_NONE = -(1 << 63)  # "not observed" in a sample column


class _RequestKeys(msgspec.Struct, gc=False):
    """A request's measurement as report.json's rows begin, in that order (a subclass's fields follow)."""

    phase: str
    order_index: int
    body_index: int
    body_sha256: str
    outcome: str
    natural_failure: str | None


class RequestRow(_RequestKeys, gc=False):
    """An answered request's row of report.json, its keys in the order the report has always had
    them: encoded as that dict is, built and encoded in half its time (a long window has 10^5).
    A request without its answer keeps the dict of its measurement's seven keys."""

    delta: Any  # the request's counter deltas (a _DeltaView, or a dict of numbers): untracked by the GC is safe
    finish_reason: str | None
    visible_output: bool
    reasoning_only: bool
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    first_byte_ns: int | None
    first_token_ns: int | None
    last_token_ns: int | None
    end_ns: int | None
    response_bytes: int
    response_sha256: str
    error: str | None
    minute: float | None
    first_token_stamp: str  # kernel | read | "" (RequestDone's)


class _Samples:
    """One phase's answered requests as the descriptive statistics read them: send-relative first
    byte, first token, last token and end (loop ns) and output tokens, 8 bytes each, so a window of a
    million events holds tens of MB here rather than every request row. The five are interleaved in
    one column (one append a request; a long window has 10^5) and read back as five slices."""

    __slots__ = ("col", "kernel_stamped", "read_stamped")
    FIELDS = ("fb", "ft", "lt", "end", "n")
    WIDTH = len(FIELDS)

    def __init__(self) -> None:
        self.col = array("q")
        self.kernel_stamped = self.read_stamped = 0  # first tokens timed by their receive stamp / their read

    def add(self, rd: Any) -> None:
        """One answered request's times and tokens (its request_done; None when it has none)."""
        if rd is None:
            self.col.extend(_NO_SAMPLE)
            return
        fb, ft, lt, end, n = rd.first_byte_ns, rd.first_token_ns, rd.last_token_ns, rd.end_ns, rd.completion_tokens
        if ft is not None and rd.first_token_stamp:
            if rd.first_token_stamp == "kernel":
                self.kernel_stamped += 1
            else:
                self.read_stamped += 1
        self.col.extend((_NONE if fb is None else fb, _NONE if ft is None else ft, _NONE if lt is None else lt,
                         _NONE if end is None else end, _NONE if n is None else n))

    def __len__(self) -> int:
        return len(self.col) // self.WIDTH

    def column(self, name: str) -> array[Any]:
        """One of FIELDS (first byte, first token, last token, end, output tokens) for every request, in order."""
        return self.col[self.FIELDS.index(name)::self.WIDTH]

    def seconds(self, col: array[Any], scale: float) -> list[float | None]:
        """A request's time from its send, in window seconds (the loop's clock times the window's scale)."""
        return [None if v == _NONE else v * scale / 1e9 for v in col]


_NO_SAMPLE = (_NONE,) * _Samples.WIDTH


def _p4(xs: list[float], q: float) -> float | None:
    v = _pct(xs, q)
    return None if v is None else round(v, 4)


def _stats(smp: _Samples | None, scale: float) -> dict[str, Any]:
    ttft = [t for t in smp.seconds(smp.column("ft"), scale) if t is not None] if smp is not None else []
    lat = [t for t in smp.seconds(smp.column("end"), scale) if t is not None] if smp is not None else []
    return {"ttft_p50_s": _p4(ttft, 50), "ttft_p90_s": _p4(ttft, 90), "latency_p50_s": _p4(lat, 50),
            "latency_p90_s": _p4(lat, 90)}


def phase_latency(samples: dict[str, _Samples], scale: float = 1.0) -> list[dict[str, Any]]:
    """Per phase that answered: time to first token and total latency (p50, p90, window seconds
    from each request's send; nearest rank), and how many first tokens were timed by the kernel's
    receive stamp or by their read (none of either: a host in the daemon's process). Descriptive."""
    return [{"phase": ph, "requests": len(smp), **_stats(smp, scale), "ttft_kernel_stamped": smp.kernel_stamped,
             "ttft_read_stamped": smp.read_stamped} for ph, smp in samples.items()]


COST_KEYS = ("first_byte_s", "ttft_s", "decode_ms_per_token", "output_tokens_per_s")


def _phase_request_costs(smp: _Samples, scale: float) -> dict[str, list[float]]:
    """Each request's costs as the client sees them: its answer's first bytes (the host's queueing, and on
    an engine that sends its stream's headers only with the first token, its prefill too: not a queue
    wait), its first token, decode (per output token after the first), and its output rate."""
    out: dict[str, list[float]] = {k: [] for k in COST_KEYS}
    ns = [None if v == _NONE else v for v in smp.column("n")]
    fbs, fts, lts, ends = (smp.seconds(smp.column(k), scale) for k in ("fb", "ft", "lt", "end"))
    for fb, ft, lt, end, n in zip(fbs, fts, lts, ends, ns):
        decode = (lt - ft) / (n - 1) * 1000 if None not in (lt, ft, n) and n > 1 and lt >= ft else None  # type: ignore[operator]  # None excluded by the test before it
        rate = n / end if n is not None and end else None
        for k, v in zip(COST_KEYS, (fb, ft, decode, rate)):
            if v is not None:
                out[k].append(v)
    return out


def phase_costs(samples: dict[str, _Samples], scale: float = 1.0,
                engine_times: dict[str, tuple[list[float], list[float]]] | None = None) -> list[dict[str, Any]]:
    """Per phase (trace arms included): first byte, TTFT, decode ms per output token and output tokens
    per second, p50 and p90 (nearest rank) of the requests that answered. Host-to-GPU transfer time
    is not part of the contract's metrics, so it is reported as not exposed. Descriptive."""
    out = []
    for ph, smp in samples.items():
        per = _phase_request_costs(smp, scale)
        row: dict[str, Any] = {"phase": ph, "requests": len(smp)}
        for k in COST_KEYS:
            for pct in (50, 90):
                row[f"{k}_p{pct}"] = _p4(per[k], pct)
        row["host_transfer_s"] = None  # not exposed by the contract's /metrics
        queue, prefill = (engine_times or {}).get(ph, ([], []))
        for k, xs in (("engine_queue_s", queue), ("engine_prefill_s", prefill)):
            for pct in (50, 90):
                row[f"{k}_p{pct}"] = _p4(xs, pct)  # None: the engine exports no such time, or not at C1
        out.append(row)
    return out


STARTING_FIELDS = ("stores_per_request", "records", "bytes_used", "bytes_capacity", "restored_tokens")


def starting_observation(so: dict[str, Any], cells: dict[str, Any], occupancy: list[dict[str, Any]]) -> dict[str, Any]:
    """The plan's starting observation against what its phase measured, line by line: reproduced only
    when every stated line was observed and matches (counts exactly, bytes and rates within the
    plan's tolerance)."""
    phase = so.get("phase") or "A.forward_prime"
    cell = cells.get(phase) or {}
    occ = next((o for o in occupancy if o.get("phase") == phase), {})
    n = cell.get("requests") or 0
    stores = occ.get("stores") or {}
    seen = {
        "stores_per_request": (sum(v for v in stores.values() if v is not None) / n) if stores and n else None,
        "records": occ.get("host_cache_records_last"),
        "bytes_used": occ.get("host_cache_bytes_used_last"),
        "bytes_capacity": occ.get("host_cache_bytes_capacity"),
        "restored_tokens": (cell.get("host") or {}).get("fetched_tokens"),
    }
    tol = float(so.get("tolerance") or 0)
    lines = []
    for k in STARTING_FIELDS:
        want = so.get(k)
        if want is None:
            continue
        got = seen[k]
        if got is None or cell.get("status") != "measured":
            same = None
        elif k in ("records", "restored_tokens"):
            same = got == want
        else:
            same = abs(got - want) <= tol * max(abs(want), 1)
        lines.append({"field": k, "expected": want, "observed": None if got is None else round(got, 4), "same": same})
    if cell.get("status") != "measured":
        status = "not_measured"
    elif lines and all(x["same"] for x in lines):
        status = "reproduced"
    elif any(x["same"] is False for x in lines):
        status = "not_reproduced"
    else:
        status = "not_observable"
    return {"phase": phase, "status": status, "lines": lines}


def trace_evidence(cells: list[dict[str, Any]], samples: dict[str, _Samples], scale: float = 1.0) -> dict[str, Any]:
    """Per trace arm, time to first token and total latency (p50, p90, window seconds from the
    send); per off/on pair, on minus off. Descriptive: a handful of requests per arm, no test."""
    arms = []
    for c in cells:
        pid = c["phase"]
        parts = pid.split(".")
        if not pid.startswith("trace.") or len(parts) != 4:
            continue  # the warm-up is not evidence
        smp = samples.get(pid)
        arms.append({"phase": pid, "status": c["status"], "trace": parts[3], "concurrency": int(parts[1][1:]),
                     "repetition": int(parts[2][1:]), "requests": len(smp) if smp is not None else 0,
                     "host_reused_tokens": (c["host"] or {}).get("reused_tokens"), **_stats(smp, scale)})
    pairs = []
    for a in arms:
        if a["trace"] != "off":
            continue
        on = next((b for b in arms if b["trace"] == "on" and b["concurrency"] == a["concurrency"]
                   and b["repetition"] == a["repetition"]), None)
        if on is None:
            continue
        both = a["status"] == on["status"] == "measured"
        pairs.append({"concurrency": a["concurrency"], "repetition": a["repetition"], "measured": both,
                      **{f"{k}_on_minus_off": (round(on[k] - a[k], 4) if both and on[k] is not None and a[k] is not None
                                               else None) for k in TRACE_STATS}})
    return {"arms": arms, "pairs": pairs,
            "note": "descriptive: window seconds from each request's send, a few requests per arm, no significance test"}


def trace_overhead(arms: list[dict[str, Any]], pairs: list[dict[str, Any]], rule: dict[str, Any]) -> dict[str, Any]:
    """Per concurrency, across the off/on pairs: the median TTFT overhead (on minus off), relative to the
    off arms' median, its spread and a bootstrap interval over the pairs; understood when the plan's
    bounds hold (`[trace] overhead_max`, `overhead_interval_max`) on every concurrency."""
    import statistics

    from flare_diag.events.stats import bootstrap_interval
    most = float(rule.get("overhead_max", 0.05))
    widest = float(rule.get("overhead_interval_max", 0.10))
    rows = []
    for conc in sorted({p["concurrency"] for p in pairs}):
        diffs = [p["ttft_p50_s_on_minus_off"] for p in pairs if p["concurrency"] == conc and p["measured"]
                 and p["ttft_p50_s_on_minus_off"] is not None]
        offs = [a["ttft_p50_s"] for a in arms if a["concurrency"] == conc and a["trace"] == "off"
                and a["status"] == "measured" and a.get("ttft_p50_s")]
        row = {"concurrency": conc, "pairs": len(diffs)}
        if len(diffs) < 2 or not offs:
            rows.append({**row, "understood": False, "why": f"{len(diffs)} measured pair(s): too few to say"})
            continue
        base = statistics.median(offs)
        med = statistics.median(diffs)
        # the interval of the median overhead, as a share of the off median: resample the pairs
        lo, hi = bootstrap_interval([base] * len(diffs), [base + d for d in diffs], statistics.median)
        lo, hi = -hi, -lo  # bootstrap_interval gives (base - x) / base; overhead is its negative
        rel = med / base
        width = hi - lo
        why = []
        if abs(rel) > most:
            why.append(f"median overhead {rel:+.1%} beyond {most:.0%}")
        if width > widest:
            why.append(f"interval {width:.1%} wide, beyond {widest:.0%}")
        rows.append({**row, "median_on_minus_off_s": round(med, 4), "relative": round(rel, 4),
                     "spread_s": round(max(diffs) - min(diffs), 4), "interval_relative": [round(lo, 4), round(hi, 4)],
                     "understood": not why, "why": "; ".join(why) or "within the plan's bounds"})
    return {"overhead": rows, "overhead_understood": bool(rows) and all(r["understood"] for r in rows),
            "overhead_rule": {"overhead_max": most, "overhead_interval_max": widest}}


_HANDLERS = {  # None: the window fold alone reads it
    "window_opened": _Projection.window_opened, "action_done": _Projection.action_done,
    "watch_observed": _Projection.watch_observed, "operator_abort": _Projection.operator_abort,
    "request_done": _Projection.request_done, "action_requested": _Projection.action_requested,
    "time_marked": None, "phase_started": _Projection.phase_started, "cell_recorded": _Projection.cell_recorded,
    "request_measured": _Projection.request_measured, "drain_observed": _Projection.drain_observed,
    "abort_decided": None, "restore_started": None, "restoration_recorded": None, "verdict_reached": None,
    "alarm": None, "bounds_scaled": None, "trace_order_frozen": None, "window_closed": None,
    "harness_rehearsed": None, "preserved_checked": None, "fault_scheduled": None, "faults_accounted": None,
}


# the actions whose answers (action_done) the report reads
_ANSWERS_READ = frozenset({"snapshot", "read_identity", "scrape_metrics", "retain_recipe", "preview", "steady_state",
                           "readmit"})
_SCRAPE: tuple[str, dict[str, Any]] = ("scrape_metrics", {})
_ARGS_READ = frozenset({"snapshot", "load", "retain_recipe", "preview", "steady_state"})


class _ActionTag(msgspec.Struct, gc=False):
    action: str  # the action's name; its arguments are skipped


class _ActionView(msgspec.Struct, gc=False):
    action_id: int
    request: _ActionTag


class _DoneView(msgspec.Struct, gc=False):
    at_ns: int
    action_id: int
    ok: bool
    data: msgspec.Raw = msgspec.Raw(b"{}")


class _RequestView(msgspec.Struct, gc=False):
    at_ns: int
    phase: str
    order_index: int
    error: str | None = None
    finish_reason: str | None = None
    visible_output: bool = False
    reasoning_only: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    first_byte_ns: int | None = None
    first_token_ns: int | None = None
    first_token_stamp: str = ""
    last_token_ns: int | None = None
    end_ns: int | None = None
    response_bytes: int = 0
    response_sha256: str = ""


def _numbers(name: str, keys: tuple[str, ...]) -> type[msgspec.Struct]:
    """A narrow view of an object of numbers: these keys in this order (astuple and asdict give
    them so), each None when absent; the object's other keys are skipped."""
    return msgspec.defstruct(name, [(k, int | float | None, None) for k in keys], frozen=True, gc=False)


# the counters the report follows (a scrape's values, a request's deltas)
_DeltaView = _numbers("_DeltaView", SERIES_KEYS)


_MeasuredDelta = _numbers("_MeasuredDelta", SERIES_KEYS + ENGINE_TIMING_KEYS)


class _MeasuredView(_RequestKeys, gc=False):
    delta: _MeasuredDelta  # type: ignore[valid-type]  # a struct made at run time (msgspec.defstruct), which msgspec decodes into


def _delta_dict(d: Any) -> dict[str, Any]:
    """A request's counter deltas as a dict: as read (a dict), or its narrow view's fields."""
    return d if type(d) is dict else msgspec.structs.asdict(d)


# the gauges the occupancy evidence reads
_OccupancyView = _numbers("_OccupancyView", OCCUPANCY_GAUGES)


class _ScrapeView(msgspec.Struct, frozen=True, gc=False):
    counters: _DeltaView = _DeltaView()  # type: ignore[valid-type]  # a struct made at run time (msgspec.defstruct), which msgspec decodes into
    gauges: _OccupancyView = _OccupancyView()  # type: ignore[valid-type]  # the same


class _WatchView(msgspec.Struct, gc=False):
    at_ns: int
    source: str
    data: msgspec.Raw = msgspec.Raw(b"{}")


class _ScrapeDoneView(msgspec.Struct, gc=False):
    """An answer read as a scrape's (a third of a long window's events), its counters and gauges in
    the same pass: one decode where a _DoneView and then its data would be two."""

    at_ns: int
    action_id: int
    ok: bool
    data: _ScrapeView = _ScrapeView()


_scrape = msgspec.json.Decoder(_ScrapeView)
_done = msgspec.json.Decoder(_DoneView)
_scrape_done = msgspec.json.Decoder(_ScrapeDoneView)


class _DoneDecoder:
    """action_done as a scrape's answer when its data fits one, else with its data kept as stored
    (the handler decodes again the few answers that fit a scrape's shape but are another action's)."""

    @staticmethod
    def decode(payload: bytes) -> _ScrapeDoneView | _DoneView:
        try:
            return _scrape_done.decode(payload)
        except msgspec.ValidationError:
            return _done.decode(payload)


_NO_GAUGES = (None,) * len(OCCUPANCY_GAUGES)
_LIGHT = {"action_requested": msgspec.json.Decoder(_ActionView), "action_done": _DoneDecoder(),
          "request_done": msgspec.json.Decoder(_RequestView), "request_measured": msgspec.json.Decoder(_MeasuredView),
          "watch_observed": msgspec.json.Decoder(_WatchView)}


# (a watch's answer is an input too, but the fold's clock stays with the ones above: the report's
# minutes were always read from them, and a watch read only for the guards must not move them)
_INPUTS = frozenset({"window_opened", "action_done", "request_done"})
_VERSION = {t: registered_type(t).schema_v for t in _LIGHT}  # a view reads its type's current version only
_DISPATCH = {t: (h, _LIGHT.get(t), t in _INPUTS, _VERSION.get(t)) for t, h in _HANDLERS.items()}


PROJECTED_TYPES = frozenset(_HANDLERS)  # a reader may skip every other type
# and the decisions of these actions (a request's send and its scrape are two fifths of a long
# window's events): a send's answer is its request_done, and an answer whose decision was not read
# is taken for a scrape's
UNREAD_ACTIONS = ("send_request", "scrape_metrics")
if not set(UNREAD_ACTIONS) <= {"send_request", _SCRAPE[0]}:
    raise RuntimeError("only a send's and a scrape's decisions may be left out: another's answer would be read as a scrape's")


def project(envelopes: Iterable[Read], window_id: str, integrity: dict[str, Any]) -> dict[str, Any]:
    return project_window(envelopes, window_id, integrity)


def project_window(envelopes: Iterable[Read], window_id: str, integrity: dict[str, Any], spool: Any = None) -> Report:
    """The report of one window. With a `spool` (daemon/reports/report_spool.py) its request rows, counter
    series and natural failures go there as they are made, and the report keeps empty lists in
    their place (the renderers assemble the files from both), so a long window's report never holds them."""
    p = _Projection(window_id, integrity, spool)
    apply, entry_of = p.apply, _DISPATCH.get
    for env in envelopes:
        # most of a long window is events no report shows (ticks): skipped here, before a call is
        # spent on them
        entry = entry_of(env.type)
        if entry is not None and env.window_id == window_id:
            apply(env, entry)
    return p.finish()


_json = msgspec.json.Encoder()
_PART_MARK = b"\x00"  # msgspec escapes every control character it encodes, so this byte is unique
ROWS_PER_CHUNK = 4096


def json_chunks(report: dict[str, Any]) -> Iterator[bytes]:
    """report.json in pieces, for writing straight to a file: the request rows (10^5 on a long
    window) go out a few thousand at a time, so no buffer the size of the whole report is built.
    A report projected into a spool has its rows, counter series and natural failures there (and
    empty lists in their place, so that each key stays where it is)."""
    spool = getattr(report, "spool", None)
    if spool is not None:
        parts = spool.json_parts()
    elif isinstance(report.get("requests"), list):
        parts = {"requests": _list_chunks(report["requests"])}
    else:
        yield _json.encode(report) + b"\n"
        return
    keys = [k for k in report if k in parts]  # in the order the encoder writes them
    pieces = _json.encode({**report, **{k: msgspec.Raw(_PART_MARK) for k in keys}}).split(_PART_MARK)
    yield pieces[0]
    for k, after in zip(keys, pieces[1:]):
        yield from parts[k]
        yield after
    yield b"\n"


def _list_chunks(items: list[Any]) -> Iterator[bytes]:
    yield b"["
    first = True
    for batch in _batches(items, ROWS_PER_CHUNK):
        part = _json.encode(batch)[1:-1]
        yield part if first else b"," + part
        first = False
    yield b"]"


def _batches(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for x in items:
        batch.append(x)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


# a list is one segment whose pieces join with nothing between them; a piece that is not a str is
# bytes already written (a spool's, read with `blocks()`)
Segment = str | list[Any]


def text_chunks(segments: Sequence[Segment], sep: str = "\n") -> Iterator[bytes]:
    """`sep.join(segments)` (each list segment joined on "") as UTF-8, in pieces of a few thousand
    strings: the request tables of a long window are tens of MB that need never be one string."""
    batch: list[str] = []
    for i, seg in enumerate(segments):
        if i:
            batch.append(sep)
        # a table of 10^5 rows is one segment
        for piece in (seg,) if isinstance(seg, str) else seg:
            if not isinstance(piece, str):
                if batch:
                    yield "".join(batch).encode()
                    batch = []
                yield from piece.blocks()
                continue
            batch.append(piece)
            if len(batch) >= ROWS_PER_CHUNK:
                yield "".join(batch).encode()
                batch = []
    if batch:
        yield "".join(batch).encode()


def join_segments(segments: list[Segment], sep: str = "\n") -> str:
    return b"".join(text_chunks(segments, sep)).decode()


def render_json(report: dict[str, Any]) -> bytes:
    """Compact, one line: report.json is for machines (`jq` indents it); people read report.md or .html."""
    return b"".join(json_chunks(report))
