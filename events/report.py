"""The window report (contract section 4, schema flare-diag.report/1) as a pure fold over the log.

The same events always give the same report: nothing here reads a clock, a file or the
environment, and every collection is emitted in log order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec
import msgspec.structs

from events.envelope import Envelope

SCHEMA = "flare-diag.report/1"
NS_PER_MIN = 60_000_000_000
HOST_KEYS = ("host_lookups", "host_hits", "host_fetched_tokens", "host_reused_tokens")
GPU_KEYS = ("gpu_hits", "gpu_reused_tokens")
SERIES_KEYS = HOST_KEYS + GPU_KEYS


class _Projection:
    """One pass over a window's events; each handler reads one event type."""

    def __init__(self, window_id: str, integrity: dict) -> None:
        self.r: dict = {"schema": SCHEMA, "window_id": window_id, "plan": None, "t0_wall": None, "outcome": None,
                        "abort": None, "cells": [], "verdict": None, "restoration": None, "integrity": integrity,
                        "timeline": [], "identity": {"expected": {}, "observed": [], "incumbent_sha256_before": None,
                                                     "incumbent_sha256_after": None, "candidate_recipe": None},
                        # exact recipe bytes retained before take-down (role -> name, sha256, size, where)
                        "recipes": {},
                        "requests": [], "natural_failures": [], "drains": [],
                        "counters": {"minute": [], **{k: [] for k in SERIES_KEYS}}, "alarms": [],
                        "trace": {"order": None, "arms": []}, "timing": None, "site": None, "rehearsal": None, "plan_sha256": None}
        self.cells: dict[str, dict] = {}
        self.actions: dict[int, tuple[str, dict]] = {}
        self.responses: dict[tuple[str, int], dict] = {}
        self.t0_ns: int | None = None
        self.last_at = 0
        self.load_label = "incumbent before take-down"
        self.restoring = False

    def minute(self, at_ns: int) -> float | None:
        return None if self.t0_ns is None else round((at_ns - self.t0_ns) / NS_PER_MIN, 4)  # as the policy rounds

    def apply(self, env: Envelope) -> None:
        entry = _DISPATCH.get(env.type)
        if entry is None:
            return
        handler, light, is_input = entry
        # The events a long window is made of are read through narrow views (only the fields this
        # report uses); an event of an older schema version goes through its upcaster instead.
        ev = light.decode(env.payload) if light is not None and env.schema_v == 1 else env.event()
        if is_input and ev.at_ns > self.last_at:
            self.last_at = ev.at_ns
        handler(self, env, ev)

    # --- inputs ---------------------------------------------------------------------------

    def window_opened(self, env: Envelope, ev) -> None:
        r = self.r
        r["plan"] = ev.plan.get("name")
        r["plan_sha256"], r["site"], r["rehearsal"] = ev.plan_sha256, ev.site, ev.rehearsal
        r["identity"]["expected"] = dict(ev.plan.get("identity") or {})
        r["identity"]["candidate_recipe"] = ev.candidate_recipe
        t = ev.plan.get("timing") or {}
        r["timing"] = {"stop_min": t.get("stop_min"), "window_min": t.get("window_min"),
                       "restore_reserve_min": t.get("restore_reserve_min")}

    def action_done(self, env: Envelope, ev) -> None:
        action, args = self.actions.pop(ev.action_id, ("", {}))
        if not ev.ok or not action:
            return
        if action == "scrape_metrics":
            series = self.r["counters"]  # columnar: one list per counter, aligned with "minute"
            series["minute"].append(self.minute(ev.at_ns))
            if isinstance(ev.data, msgspec.Raw):
                values = msgspec.structs.astuple(_counters.decode(ev.data).counters)
            else:
                c = ev.data.get("counters") or {}
                values = tuple(c.get(k) for k in SERIES_KEYS)
            for k, v in zip(SERIES_KEYS, values):
                series[k].append(v)
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
        elif action == "read_identity":
            self._observed(self.load_label, env, d)
            if self.restoring:
                self.r["identity"]["incumbent_sha256_after"] = d.get("recipe_sha256")

    def _observed(self, label: str, env: Envelope, ident: dict) -> None:
        exp = self.r["identity"]["expected"]
        mism = [k for k in exp if k in ident and ident.get(k) != exp[k]]
        self.r["identity"]["observed"].append({"label": label, "minute": self.minute(self.last_at),
                                               "identity": ident, "mismatches": mism})

    def request_done(self, env: Envelope, ev) -> None:
        self.responses[(ev.phase, ev.order_index)] = ev  # joined to its measurement when that comes

    # --- decisions ------------------------------------------------------------------------

    def action_requested(self, env: Envelope, ev) -> None:
        if ev.action not in _WATCHED_ACTIONS:
            return
        args = msgspec.json.decode(ev.args) if isinstance(ev.args, msgspec.Raw) else ev.args
        self.actions[ev.action_id] = (ev.action, args)
        if ev.action == "load":
            self.load_label = "incumbent after restore" if args.get("label") == "incumbent" \
                else f"incarnation {args.get('label')}"

    def time_marked(self, env: Envelope, ev) -> None:
        if ev.mark == "t0":
            self.r["t0_wall"] = env.wall_ns
            self.t0_ns = self.last_at
        self.r["timeline"].append({"minute": ev.minute, "event": ev.mark})

    def phase_started(self, env: Envelope, ev) -> None:
        self.r["timeline"].append({"minute": ev.minute, "event": f"phase {ev.phase} started"})

    def cell_recorded(self, env: Envelope, ev) -> None:
        self.r["timeline"].append({"minute": self.minute(self.last_at), "event": f"cell {ev.phase}: {ev.status}"})
        self.cells[ev.phase] = {"phase": ev.phase, "status": ev.status, "reason": ev.reason, "requests": ev.requests,
                                "host": ev.host, "gpu": ev.gpu, "comparable": ev.comparable,
                                "natural_failures": ev.natural_failures}

    def request_measured(self, env: Envelope, ev) -> None:
        d = msgspec.structs.asdict(ev.delta) if isinstance(ev.delta, _DeltaView) else {k: ev.delta.get(k) for k in SERIES_KEYS}
        req = {"phase": ev.phase, "order_index": ev.order_index, "body_index": ev.body_index,
               "body_sha256": ev.body_sha256, "outcome": ev.outcome, "natural_failure": ev.natural_failure,
               "delta": d}
        rd = self.responses.pop((ev.phase, ev.order_index), None)
        if rd is not None:
            req.update(finish_reason=rd.finish_reason, visible_output=rd.visible_output,
                       reasoning_only=rd.reasoning_only, prompt_tokens=rd.prompt_tokens,
                       completion_tokens=rd.completion_tokens, cached_tokens=rd.cached_tokens,
                       first_byte_ns=rd.first_byte_ns, first_token_ns=rd.first_token_ns,
                       last_token_ns=rd.last_token_ns, end_ns=rd.end_ns, response_bytes=rd.response_bytes,
                       response_sha256=rd.response_sha256, error=rd.error, minute=self.minute(rd.at_ns))
        self.r["requests"].append(req)
        if ev.natural_failure:
            self.r["natural_failures"].append({"phase": ev.phase, "order_index": ev.order_index,
                                               "body_index": ev.body_index, "kind": ev.natural_failure})

    def drain_observed(self, env: Envelope, ev) -> None:
        self.r["drains"].append({"purpose": ev.purpose, "settled": ev.settled, "waited_s": ev.waited_s,
                                 "polls": ev.polls, "minute": ev.minute})

    def abort_decided(self, env: Envelope, ev) -> None:
        self.r["abort"] = {"reason": ev.reason, "detail": ev.detail, "minute": ev.minute}
        self.r["timeline"].append({"minute": ev.minute, "event": f"abort: {ev.reason}"})

    def restore_started(self, env: Envelope, ev) -> None:
        self.restoring = True
        self.r["timeline"].append({"minute": ev.minute, "event": f"restore started ({ev.cause})"})

    def restoration_recorded(self, env: Envelope, ev) -> None:
        self.r["restoration"] = {"started_minute": ev.started_minute, "finished_minute": ev.finished_minute,
                                 **ev.checks, "verified": ev.verified}

    def verdict_reached(self, env: Envelope, ev) -> None:
        self.r["verdict"] = {"hypothesis": ev.hypothesis, "basis": ev.basis, "next_experiment": ev.next_experiment,
                             "findings": ev.findings}

    def alarm(self, env: Envelope, ev) -> None:
        self.r["alarms"].append({"kind": ev.kind, "detail": ev.detail})

    def trace_order_frozen(self, env: Envelope, ev) -> None:
        self.r["trace"]["order"] = ev.order

    def window_closed(self, env: Envelope, ev) -> None:
        self.r["outcome"] = ev.outcome
        self.r["timeline"].append({"minute": ev.minute, "event": f"window closed: {ev.outcome}"})

    def finish(self) -> dict:
        r = self.r
        r["cells"] = list(self.cells.values())
        r["trace"]["arms"] = [{"phase": c["phase"], "status": c["status"],
                               "trace": "on" if c["phase"].endswith(".on") else "off",
                               "host_reused_tokens": (c["host"] or {}).get("reused_tokens")}
                              for c in r["cells"] if c["phase"].startswith("trace.")]
        return r


_HANDLERS = {
    "window_opened": _Projection.window_opened, "action_done": _Projection.action_done,
    "request_done": _Projection.request_done, "action_requested": _Projection.action_requested,
    "time_marked": _Projection.time_marked, "phase_started": _Projection.phase_started,
    "cell_recorded": _Projection.cell_recorded, "request_measured": _Projection.request_measured,
    "drain_observed": _Projection.drain_observed, "abort_decided": _Projection.abort_decided,
    "restore_started": _Projection.restore_started, "restoration_recorded": _Projection.restoration_recorded,
    "verdict_reached": _Projection.verdict_reached, "alarm": _Projection.alarm,
    "trace_order_frozen": _Projection.trace_order_frozen, "window_closed": _Projection.window_closed,
}


_WATCHED_ACTIONS = frozenset({"snapshot", "read_identity", "load", "scrape_metrics", "retain_recipe", "preview"})


class _ActionView(msgspec.Struct):
    action_id: int
    action: str
    args: msgspec.Raw = msgspec.Raw(b"{}")


class _DoneView(msgspec.Struct):
    at_ns: int
    action_id: int
    ok: bool
    data: msgspec.Raw = msgspec.Raw(b"{}")


class _RequestView(msgspec.Struct):
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
    last_token_ns: int | None = None
    end_ns: int | None = None
    response_bytes: int = 0
    response_sha256: str = ""


class _DeltaView(msgspec.Struct, frozen=True):
    """The counters the report follows (a scrape's values, a request's deltas), in SERIES_KEYS
    order; a counter the engine lacks stays None."""
    host_lookups: int | float | None = None
    host_hits: int | float | None = None
    host_fetched_tokens: int | float | None = None
    host_reused_tokens: int | float | None = None
    gpu_hits: int | float | None = None
    gpu_reused_tokens: int | float | None = None


if _DeltaView.__struct_fields__ != SERIES_KEYS:  # asdict() must give the report's key order
    raise RuntimeError("_DeltaView fields drifted from SERIES_KEYS")


class _MeasuredView(msgspec.Struct):
    phase: str
    order_index: int
    body_index: int
    body_sha256: str
    outcome: str
    natural_failure: str | None
    delta: _DeltaView


class _CountersView(msgspec.Struct):
    counters: _DeltaView = _DeltaView()


_counters = msgspec.json.Decoder(_CountersView)
_LIGHT = {"action_requested": msgspec.json.Decoder(_ActionView), "action_done": msgspec.json.Decoder(_DoneView),
          "request_done": msgspec.json.Decoder(_RequestView), "request_measured": msgspec.json.Decoder(_MeasuredView)}


_INPUTS = frozenset({"window_opened", "action_done", "request_done"})
_DISPATCH = {t: (h, _LIGHT.get(t), t in _INPUTS) for t, h in _HANDLERS.items()}


PROJECTED_TYPES = frozenset(_HANDLERS)  # a reader may skip every other type


def project(envelopes: Iterable[Envelope], window_id: str, integrity: dict) -> dict:
    p = _Projection(window_id, integrity)
    for env in envelopes:
        if env.window_id == window_id:
            p.apply(env)
    return p.finish()


_json = msgspec.json.Encoder()
_REQUESTS_MARK = b"\x00"  # msgspec escapes every control character it encodes, so this byte is unique
ROWS_PER_CHUNK = 4096


def json_chunks(report: dict) -> Iterator[bytes]:
    """report.json in pieces, for writing straight to a file: the request rows (10^5 on a long
    window) go out a few thousand at a time, so no buffer the size of the whole report is built."""
    if not isinstance(report.get("requests"), list):
        yield _json.encode(report) + b"\n"
        return
    reqs = report["requests"]
    head = _json.encode({**report, "requests": msgspec.Raw(_REQUESTS_MARK)})
    before, after = head.split(_REQUESTS_MARK)
    yield before + b"["
    for i in range(0, len(reqs), ROWS_PER_CHUNK):
        part = _json.encode(reqs[i:i + ROWS_PER_CHUNK])[1:-1]
        yield part if i == 0 else b"," + part
    yield b"]" + after + b"\n"


Segment = str | list[str]  # a list is one segment whose pieces join with nothing between them


def text_chunks(segments: list[Segment], sep: str = "\n") -> Iterator[bytes]:
    """`sep.join(segments)` (each list segment joined on "") as UTF-8, in pieces of a few thousand
    strings: the request tables of a long window are tens of MB that need never be one string."""
    batch: list[str] = []
    for i, seg in enumerate(segments):
        if i:
            batch.append(sep)
        pieces = (seg,) if isinstance(seg, str) else seg
        for k in range(0, len(pieces), ROWS_PER_CHUNK):  # a table of 10^5 rows is one segment
            batch.extend(pieces[k:k + ROWS_PER_CHUNK])
            if len(batch) >= ROWS_PER_CHUNK:
                yield "".join(batch).encode()
                batch = []
    if batch:
        yield "".join(batch).encode()


def join_segments(segments: list[Segment], sep: str = "\n") -> str:
    return sep.join(seg if isinstance(seg, str) else "".join(seg) for seg in segments)


def render_json(report: dict) -> bytes:
    """Compact, one line: report.json is for machines (`jq` indents it); people read report.md or .html."""
    return b"".join(json_chunks(report))
