"""A second Flare host, written from contract.md section 1 alone: stdlib only, no code shared with flaresim.

Each of the five services (serving, manager, router, monitoring, GPU view) listens on a port of its
own, which flaresim (one base URL) never exercises. Replies carry exactly the contract's fields. The
host cache is the simplest one that shows reuse: an LRU of full-prompt checkpoints, `cache_entries`
long, emptied with the counters on every new incarnation.

Faults a config may ask for: `drift` ({"after": N, "field": F, "value": V}: once an incarnation has
served N chat requests, its identity shows F as V; F may also be `gpu_uuid` or `gpu_power_limit_w`,
the second GPU's, which the GPU view shows too), and `admit_on_incumbent_load` (the router readmits the primary by itself as the incumbent loads: a
containment breach during the restore), `echo_token` (the manager's state answers 503 with the caller's Authorization header in its error),
`restore_never_completes` (a lookup that finds
its entry counts a hit, but nothing is fetched or reused: the restore path is broken, not the keys). With fewer entries than a fixture has
bodies, a forward replay after a forward prime finds nothing (LRU's sequential-scan pathology) while
a reverse replay finds the newest entries: churn. With enough entries, everything is found.

Run: `python -m tests.contract_host CONFIG.json`; prints one JSON line with each service's URL,
serves until killed, and appends every request it receives to `request_log` (JSON lines).

`set_cookie` has every answer set a cookie (a load balancer's sticky session, say); the request log
records any Cookie header that comes back.

Misbehaviours of real engines and supervisors:
- `restart` ({"incarnation": "c3", "chats": N, "scrapes_after": M}): once that incarnation has served N
  chat requests and answered M scrapes of /metrics after that, the engine restarts under the same
  incarnation string (counters, cache and trace back to their start; `process_start_time_seconds` moves
  unless `no_start_time`), as a supervisor's `Restart=` or a liveness probe does. Once. With `"new_id": true`
  it comes back as the next incarnation string instead (the same recipe, loaded again by a supervisor).
- `reject_value` ({"reasoning_effort": "max"}): every chat body with that value is refused 400 before any
  output, as a release whose schema lacks the value does; `reject_nth` ([k, ...]): the k-th chat
  requests (1-based, on the serving port) are refused 400.
- `response_cache` (true): a gateway before the engine answers an exact body it has answered before from its
  store, as that answer first went out (its completion id, text and usage); the engine never sees it. With
  "new_id" it names each stored answer it gives anew.
- `metrics_twin` (true): /metrics answers for an idle twin of the engine (the same build and incarnation
  labels, none of the window's requests), as a site whose monitoring URL names another replica does.
- `crash_after_load` ("c2"): the engine dies just after its load as that incarnation is answered: the identity
  shows no incarnation, /health answers 503 and the manager has nothing loaded.
- `die_mid_chat` (k): the engine dies under the k-th chat request's stream (on the serving port), after its
  first event: the identity shows no incarnation, /health answers 503, and that stream says nothing more
  (its socket held open) until an incarnation is loaded again.
- `hang_mid_chat` (k): the engine hangs under the k-th chat request's stream (on the serving port), after its
  first event, as one whose collective hung does: /health still answers 200, the identity and the metrics
  still answer, and that stream says nothing more until its incarnation is unloaded (or a minute has passed).
- `hang_incumbent_reload` (true): the incumbent the window loads back hangs at its first generation and every one
  after, as an engine whose collective hung as it started serving: /health, the identity and the metrics
  answer; a streamed generation gets its head and one event, one not streamed gets nothing, and either is
  held until that incarnation is unloaded (or a minute has passed).
- `abort_nth` ([k, ...]): the k-th chat requests' streams end after their second event with finish_reason
  "abort" and their usage, as an ordinary chunk, as SGLang ends a request aborted gracefully (its /abort_request).
- `monitoring_lag_s` (seconds): for that long after the incumbent is loaded back, monitoring lists the primary
  registered but not healthy, as a monitoring system shows a target that came back only at its next scrape.
- `flaky_after_restore` ({"identity": N, "router": M, "chat": K}): once the incumbent is loaded back, the first N
  identity reads, M router backend reads and K chat requests on the serving port answer 503, as an engine or a
  proxy still coming up does.
- `readmit_applied_after_s` (seconds): the router answers a readmit at once and applies it that long after, as one
  that pushes the change to its proxies does; its backends show the primary out until then.
- `busy_after_unload_s` (seconds): for that long after an unload, a load of the incumbent is refused 503, as a
  manager still releasing what the last engine held refuses it.
- `runaway_chat` (k): the k-th chat request's stream (on the serving port) goes on, one token an event, past
  its body's max_tokens until its client hangs up, as an engine that reads another field than max_tokens does.
- `splice_nth` ([k, ...]): the k-th chat requests' streams go on, after their third event, under another
  completion id, as a router that resumed a generation on a second backend and spliced both answers into
  one stream.
- `external_cache`: the host cache is a store outside the engine (an external KV store): a load keeps what it
  holds, and the engine's occupancy gauges count only what the incarnation stored itself.
- `trace_survives_load`: the trace switch is the host's, not the incarnation's: a load keeps it.
- `sglang` (true): /metrics answers in SGLang 0.5.23's names and shapes (`sglang:num_requests_total` and the
  token counters split by `is_streaming`, `sglang:cached_tokens_total` by `cache_source`, HiCache's host
  gauges in tokens, the queue-time histogram; no lookups, hits, retiring or transfer gauges, no build or
  incarnation info), as tests/data/metrics/sglang.prom; and every incarnation comes up having counted its
  own warm-up generation (one request, 7 prompt and 8 generated tokens), as SGLang's does unless launched
  with --skip-server-warmup.
- `gpu_memory_on_load` (bytes): while an incumbent load is under way, the GPU view shows that much
  memory used on every GPU.
- `gpu_silent` ({"after_chats": N, "for_s": S}): once N chat requests came, the GPU view answers 503
  for S real seconds, then answers again.

`tls` ({"cert": PATH, "key": PATH}): every service answers over https with that certificate.

`idle_close_s` emulates a host closing idle keep-alive connections in the unlucky order: a request
that arrives on a connection idle for longer than that is dropped without an answer, as when the
host's close crosses the client's next request on the wire.
"""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
import sys
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SERVICES = ("serving", "manager", "router", "monitoring", "gpu")


class State:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.lock = threading.Lock()
        self.recipes: dict[str, bytes] = {n: t.encode() for n, t in cfg["recipes"].items()}
        self.loaded: str | None = cfg["incumbent"]
        self.incarnation = 1
        self.trace = False
        self.admitted = True
        self.restarted = False
        self.start_time = 1_700_000_000.0
        self.chats = 0  # chat requests the serving port has received, any incarnation
        self.state_reads = 0  # GET /manager/v1/state answered
        self.loads = 0  # POST /manager/v1/load received
        self.starting = False  # a load that never answered is still starting its engine (cfg hang_load): busy
        self.stamped = 0  # prompts the stamping gateway (cfg stamp_prompts) has stamped
        self.answers: dict[bytes, tuple] = {}  # the response-caching gateway's stored answers (cfg response_cache)
        self.loading_incumbent = False
        self.hung: int | None = None  # the incarnation that holds every generation (cfg hang_incumbent_reload)
        self.incumbent_back: float | None = None  # when the incumbent was last loaded back (cfg monitoring_lag_s)
        self.unloaded_at = float("-inf")  # when the last unload was answered (cfg busy_after_unload_s)
        self.log = open(cfg["request_log"], "a", buffering=1) if cfg.get("request_log") else None
        self._reset()

    def _reset(self) -> None:
        self.cache: OrderedDict[str, int] = OrderedDict()
        self.gpu: OrderedDict[str, int] = OrderedDict()  # `gpu_entries`: whole prompts on the GPU, in front
        self.c = {"lookups": 0, "hits": 0, "fetched": 0, "reused": 0, "stores": 0, "evictions": 0,
                  "gpu_queries": 0, "gpu_hits": 0, "gpu_reused": 0, "prompt": 0, "generation": 0, "stop": 0, "length": 0}
        self.active = 0
        self.served = 0  # chat requests this incarnation has answered
        self.scrapes = 0  # scrapes of /metrics this incarnation has answered since its `restart` was due

    def maybe_restart(self, scraping: bool = False) -> None:
        """The `restart` fault, when it is due: the same incarnation string, everything else anew."""
        r = self.cfg.get("restart")
        if not r or self.restarted or self.loaded is None or f"c{self.incarnation}" != r["incarnation"]:
            return
        if self.served < r["chats"]:
            return
        after = r.get("scrapes_after", 0)
        if scraping:
            self.scrapes += 1
        # at once after the N-th chat when no scrape is to come between; else at the (M+1)-th scrape
        if not (self.scrapes > after if scraping else after == 0):
            return
        self.restarted = True
        self.start_time += 17.0
        self.trace = False
        self._reset()
        if r.get("new_id"):
            self.incarnation += 1

    def drifted(self) -> dict:
        """The identity fields a `drift` fault has changed by now (empty before it is due)."""
        d = self.cfg.get("drift")
        if not d or self.served < d["after"] or self.loaded == self.cfg["incumbent"]:
            return {}
        return {d["field"]: d["value"]}

    def gpus(self) -> list[dict]:
        d = self.drifted()
        gpus = [dict(g) for g in self.cfg["gpus"]]
        if "gpu_uuid" in d:
            gpus[1]["uuid"] = d["gpu_uuid"]
        if "gpu_power_limit_w" in d:
            gpus[1]["power_limit_w"] = d["gpu_power_limit_w"]
        return gpus

    def sha(self, name: str) -> str:
        return hashlib.sha256(self.recipes[name]).hexdigest()

    def record(self, entry: dict) -> None:
        if self.log is not None:
            with self.lock:
                self.log.write(json.dumps(entry) + "\n")


def build(state: State, service: str):
    cfg = state.cfg

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a) -> None:  # quiet
            pass

        def handle_one_request(self) -> None:
            try:
                self.raw_requestline = self.rfile.readline(65537)
            except OSError:  # the client closed or reset the connection
                self.raw_requestline = b""
            if not self.raw_requestline:
                self.close_connection = True
                return
            # idle since the last answer on this connection, when the next request arrives
            idle = time.monotonic() - self._done_at if hasattr(self, "_done_at") else 0.0
            if cfg.get("idle_close_s") and idle > cfg["idle_close_s"]:
                state.record({"service": service, "request": self.raw_requestline.decode(errors="replace").strip(),
                              "dropped": True, "idle_s": round(idle, 3)})
                self.close_connection = True
                return
            if not self.parse_request():
                return
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self.send_error(405)
            else:
                method()
            self.wfile.flush()
            self._done_at = time.monotonic()

        # --- plumbing
        def end_headers(self) -> None:
            if cfg.get("set_cookie"):
                self.send_header("Set-Cookie", f"sticky-{service}={time.monotonic_ns()}; Path=/")
            super().end_headers()

        def body(self) -> bytes:
            n = int(self.headers.get("content-length") or 0)
            return self.rfile.read(n) if n else b""

        def send_json(self, obj: object, status: int = 200) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def error(self, status: int, type_: str, message: str) -> None:
            self.send_json({"error": {"type": type_, "message": message}}, status)

        def authed(self) -> bool:
            want = cfg["tokens"][service]
            if self.headers.get("authorization") != f"Bearer {want}":
                self.error(401, "authentication", "missing or wrong bearer token")
                return False
            return True

        def do_GET(self) -> None:
            raw = b""
            self._route("GET", raw)

        def do_POST(self) -> None:
            self._route("POST", self.body())

        def _route(self, method: str, raw: bytes) -> None:
            entry = {"service": service, "method": method, "path": self.path,
                     "body_sha256": hashlib.sha256(raw).hexdigest() if raw else None}
            if self.headers.get("cookie") is not None:
                entry["cookie"] = self.headers["cookie"]
            state.record(entry)
            if not self.authed():
                return
            fn = ROUTES.get((service, method, self.path))
            if fn is None:
                for (svc, m, prefix), f in PREFIXES.items():
                    if svc == service and m == method and self.path.startswith(prefix):
                        fn = lambda h, r, f=f, rest=self.path[len(prefix):]: f(h, r, rest)  # noqa: E731, B008 - binds this request's path
                        break
            if fn is None:
                self.error(404, "not_found", f"{method} {self.path}")
                return
            fn(self, raw)

    return Handler


# --- serving ---------------------------------------------------------------------------------

def identity(state: State) -> dict:
    cfg = state.cfg
    b = cfg["build"]
    name = state.loaded
    return {"image": b["image"], "flare_commit": b["flare_commit"], "package": b["package"], "model": b["model"],
            "tensor_parallel": b["tensor_parallel"], "draft_tokens": b["draft_tokens"],
            "host_cache_bytes": b["host_cache_bytes"], "disk_cache_enabled": False, "capture_enabled": False,
            "trace_enabled": state.trace,
            "gpus": [{"uuid": g["uuid"], "power_limit_w": g["power_limit_w"]} for g in state.gpus()],
            "recipe": name, "recipe_sha256": state.sha(name) if name else None,
            "incarnation": f"c{state.incarnation}" if name else None,
            **{k: v for k, v in state.drifted().items() if not k.startswith("gpu_")}}


def r_health(h, _raw) -> None:
    ok = h.server.state.loaded is not None
    data = b"ok" if ok else b"no incarnation"
    h.send_response(200 if ok else 503)
    h.send_header("content-length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def flaky(st: State, service: str) -> bool:
    """Whether this read of `service` is one of the first `flaky_after_restore` ones since the incumbent came back."""
    left = (st.cfg.get("flaky_after_restore") or {}).get(service, 0)
    if st.incumbent_back is None or not left:
        return False
    with st.lock:
        n = st.__dict__.setdefault("flaky_reads", {}).get(service, 0)
        st.flaky_reads[service] = n + 1
    return n < left


def r_identity(h, _raw) -> None:
    if flaky(h.server.state, "identity"):
        return h.error(503, "unavailable", "the engine is still coming up")
    if not r_identity_deep(h):
        h.send_json(identity(h.server.state))


def r_identity_deep(h) -> bool:
    """A hostile host's identity: JSON nested far deeper than any decoder recurses."""
    depth = h.server.state.cfg.get("deep_identity")
    if not depth:
        return False
    data = b"[" * depth + b"]" * depth
    h.send_response(200)
    h.send_header("content-type", "application/json")
    h.send_header("content-length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)
    return True


def r_openapi(h, _raw) -> None:
    """The OpenAPI document the site's config names (a recorded vLLM's), as vLLM's server publishes it."""
    path = h.server.state.cfg.get("openapi")
    if not path:
        return h.error(404, "not_found", "GET /openapi.json")
    h.send_json(json.loads(open(path).read()))


def r_trace(h, raw) -> None:
    st = h.server.state
    if st.cfg.get("no_trace_route"):  # an engine with no such switch (a bare vLLM answers 404)
        return h.error(404, "not_found", "POST /flare/v1/trace")
    want = bool(json.loads(raw or b"{}").get("enabled"))
    st.record({"service": "serving", "trace_set": want, "was": st.trace})
    st.trace = want
    h.send_json(identity(st))


def generate(h, raw: bytes, routed: bool = False) -> None:
    st: State = h.server.state
    if routed and not st.admitted:
        return h.error(503, "unavailable", "no admitted backend")
    if st.loaded is None:
        return h.error(503, "unavailable", "no incarnation loaded")
    if not routed and flaky(st, "chat"):
        return h.error(503, "unavailable", "the engine is still warming up")
    try:
        req = json.loads(raw)
        messages = req["messages"]
    except (ValueError, KeyError, TypeError):
        return h.error(400, "invalid_request", "expected a JSON body with messages")
    if not routed:
        st.chats += 1
        if st.chats in st.cfg.get("reject_nth", []):
            return h.error(400, "invalid_request", f"request {st.chats} refused by the host's schema")
    for field, value in (st.cfg.get("reject_value") or {}).items():
        if req.get(field) == value:
            return h.error(400, "BadRequestError", f"1 validation error: {field}: input should be 'low', 'medium' "
                                                   f"or 'high', got {value!r}")
    if st.cfg.get("stamp_prompts"):  # a gateway before the engine stamps each prompt: its number, its second
        with st.lock:
            st.stamped += 1
            stamp = f"[gateway] request {st.stamped} at {int(time.time())}" + " trace" * (st.stamped % 5)
        messages = [{"role": "system", "content": stamp}, *messages]
    if st.cfg.get("response_cache") and not routed and raw in st.answers:
        rid, *rest = st.answers[raw]  # the gateway's stored answer: the engine never sees the body
        if st.cfg["response_cache"] == "new_id":  # a gateway that names each answer it gives anew
            rid = "c-" + hashlib.sha256(rid.encode() + str(time.monotonic_ns()).encode()).hexdigest()[:16]
        return stream_answer(h, rid, *rest)
    text = " ".join(str(m.get("content", "")) for m in messages)
    prompt = len(text.split()) + 4 * len(messages)
    key = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
    max_tokens = int(req.get("max_tokens") or 16)
    n = min(max_tokens, 8)
    finish = "stop" if max_tokens > 8 else "length"
    with st.lock:
        c = st.c
        c["gpu_queries"] += prompt
        reused = on_gpu = 0
        if st.cfg.get("gpu_entries") and key in st.gpu:  # served from the GPU tier: the host tier is not asked
            st.gpu.move_to_end(key)
            c["gpu_hits"] += prompt  # "of those, tokens found": tokens, as queries and reused are
            c["gpu_reused"] += prompt
            on_gpu = prompt
        elif key in st.cache:
            c["lookups"] += 1
            st.cache.move_to_end(key)
            c["hits"] += 1
            if not st.cfg.get("restore_never_completes"):
                reused = st.cache[key]
                c["fetched"] += reused
                c["reused"] += reused
        else:
            c["lookups"] += 1
            st.cache[key] = prompt
            c["stores"] += 1
            while len(st.cache) > st.cfg["cache_entries"]:
                st.cache.popitem(last=False)
                c["evictions"] += 1
        if st.cfg.get("gpu_entries") and key not in st.gpu:  # what prefill produced or restored is on the GPU now
            st.gpu[key] = prompt
            while len(st.gpu) > st.cfg["gpu_entries"]:
                st.gpu.popitem(last=False)
        c["prompt"] += prompt
        c["generation"] += n
        c[finish] += 1
        st.active += 1
    usage = {"prompt_tokens": prompt, "completion_tokens": n, "prompt_tokens_details": {"cached_tokens": reused + on_gpu}}
    rid = "c-" + hashlib.sha256(raw + str(time.monotonic_ns()).encode()).hexdigest()[:16]
    if st.cfg.get("response_cache") and not routed and req.get("stream"):
        st.answers[raw] = (rid, n, finish, usage)
    died = finished = False

    def count_end() -> None:
        """The request's end, counted before its last bytes go out (as an engine's scheduler has it done when
        the answer's end is written), so that no scrape the answer lets the daemon send can find it running."""
        nonlocal finished
        with st.lock:
            finished = True
            st.active -= 1
            if not routed:
                st.served += 1
                st.maybe_restart()
    hung = not routed and st.hung == st.incarnation
    try:
        if hung and not req.get("stream"):
            _hang_mid_stream(st)  # nothing at all: a whole answer is never ready
            return
        if not req.get("stream"):
            count_end()
            return h.send_json({"id": rid, "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": " ok" * n}, "finish_reason": finish}],
                "usage": usage})
        event = _stream_head(h, rid)
        base = {"id": rid, "object": "chat.completion.chunk"}
        event({**base, "choices": [{"index": 0, "delta": {"reasoning_content": "thinking"}, "finish_reason": None}]})
        if not routed and st.chats == st.cfg.get("die_mid_chat"):
            died = True  # taken off with everything else the engine held
            return _die_mid_stream(st)
        if not routed and st.chats == st.cfg.get("runaway_chat"):
            n = 10**7  # until the client hangs up (a broken pipe ends the handler)
        if hung or not routed and st.chats == st.cfg.get("hang_mid_chat"):
            died = _hang_mid_stream(st)  # unloaded under it: gone with what the engine held
            return
        if not routed and st.chats in st.cfg.get("abort_nth", []):
            n, finish = 2, "abort"  # ended by the engine: what it generated so far, then an ordinary last chunk
            usage = {**usage, "completion_tokens": n}
        for i in range(n - 1):
            time.sleep(st.cfg.get("token_delay_s", 0))  # a slower engine: requests in flight long enough to be seen
            if i == 1 and not routed and st.chats in st.cfg.get("splice_nth", []):
                base = {**base, "id": rid + "-resumed"}  # the rest of the stream is another backend's answer
            event({**base, "choices": [{"index": 0, "delta": {"content": " ok"}, "finish_reason": None}]})
        count_end()
        event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage})
        event(b"[DONE]")
        h.wfile.write(b"0\r\n\r\n")
    finally:
        if not (finished or died):  # a stream cut short by its client
            count_end()


def _die_mid_stream(st: State) -> None:
    """`die_mid_chat`: the engine dies under this stream, its socket held open by what is left of it: nothing
    serves, /health answers 503, and the stream says nothing more until an incarnation is loaded again (or a
    minute has passed); then the connection closes with the answer unfinished."""
    with st.lock:
        st.loaded = None
        st.active = 0
    until = time.monotonic() + 60
    while st.loaded is None and time.monotonic() < until:
        time.sleep(0.05)


def _hang_mid_stream(st: State) -> bool:
    """`hang_mid_chat`: the stream says nothing more while everything else answers, until the incarnation it
    runs on is unloaded (True) or a minute has passed; then the connection closes with the answer unfinished."""
    on, until = st.loaded, time.monotonic() + 60
    while st.loaded == on and time.monotonic() < until:
        time.sleep(0.05)
    return st.loaded != on


def _stream_head(h, rid: str):
    """Starts a streamed answer; returns the function that writes one of its events."""
    h.send_response(200)
    h.send_header("content-type", "text/event-stream")
    h.send_header("x-request-id", rid)
    h.send_header("transfer-encoding", "chunked")
    h.end_headers()

    def event(obj) -> None:
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    return event


def stream_answer(h, rid: str, n: int, finish: str, usage: dict) -> None:
    """A stored answer streamed again as it first went out: its id, its text, its usage."""
    event = _stream_head(h, rid)
    base = {"id": rid, "object": "chat.completion.chunk"}
    event({**base, "choices": [{"index": 0, "delta": {"reasoning_content": "thinking"}, "finish_reason": None}]})
    for _ in range(n - 1):
        event({**base, "choices": [{"index": 0, "delta": {"content": " ok"}, "finish_reason": None}]})
    event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage})
    event(b"[DONE]")
    h.wfile.write(b"0\r\n\r\n")


def r_metrics(h, _raw) -> None:
    st: State = h.server.state
    with st.lock:
        st.maybe_restart(scraping=True)
    omit = set(st.cfg.get("omit_metrics", []))
    twin = st.cfg.get("metrics_twin")  # an idle twin's /metrics: the same build and labels, none of the requests
    c = dict.fromkeys(st.c, 0) if twin else st.c
    active, records = (0, 0) if twin else (st.active, len(st.cache))
    if st.cfg.get("external_cache"):  # the engine's gauges see only what it stored itself
        records = min(records, st.c["stores"])
    cap = st.cfg["cache_entries"]
    bytes_cap = st.cfg["build"]["host_cache_bytes"]
    lines: list[str] = []

    def fam(name: str, kind: str, samples: list[tuple[str, float]]) -> None:
        if name in omit:
            return
        lines.append(f"# TYPE {name} {kind}")
        for labels, v in samples:
            suffix = "_total" if kind == "counter" else ""
            lines.append(f"{name}{suffix}{labels} {v}")

    if st.loaded is not None and st.cfg.get("sglang"):
        lines += _sglang_lines(st, c, active)
    elif st.loaded is not None:
        fam("flare_host_cache_lookups", "counter", [("", c["lookups"])])
        fam("flare_host_cache_hits", "counter", [("", c["hits"])])
        fam("flare_host_cache_fetched_tokens", "counter", [("", c["fetched"])])
        fam("flare_host_cache_reused_tokens", "counter", [("", c["reused"])])
        fam("flare_host_cache_stores", "counter", [('{checkpoint="message_prefix"}', 0),
                                                   ('{checkpoint="full_prompt"}', c["stores"]),
                                                   ('{checkpoint="terminal"}', 0)])
        fam("flare_host_cache_evictions", "counter", [('{pool="row"}', c["evictions"]), ('{pool="page"}', 0)])
        fam("flare_host_cache_compactions", "counter", [("", 0)])
        fam("flare_gpu_prefix_cache_queries", "counter", [("", c["gpu_queries"])])
        fam("flare_gpu_prefix_cache_hits", "counter", [("", c["gpu_hits"])])
        fam("flare_gpu_prefix_cache_reused_tokens", "counter", [("", c["gpu_reused"])])
        fam("flare_requests_finished", "counter", [('{finish_reason="stop"}', c["stop"]),
                                                   ('{finish_reason="length"}', c["length"])])
        fam("flare_prompt_tokens", "counter", [("", c["prompt"])])
        fam("flare_generation_tokens", "counter", [("", c["generation"])])
        for g, v in (("flare_requests_active", active), ("flare_requests_pending", 0), ("flare_requests_retiring", 0),
                     ("flare_host_transfers_inflight", 0), ("flare_host_transfers_waiting", 0),
                     ("flare_host_cache_records", records),
                     ("flare_host_cache_bytes_used", records * (bytes_cap // max(cap, 1))),
                     ("flare_host_cache_bytes_capacity", bytes_cap),
                     ("flare_host_cache_rows_used", records), ("flare_host_cache_rows_capacity", cap),
                     ("flare_host_cache_pages_used", 0), ("flare_host_cache_pages_capacity", cap),
                     ("flare_process_resident_bytes", 8 << 30)):
            fam(g, "gauge", [("", v)])
        if not st.cfg.get("no_start_time"):
            fam("process_start_time_seconds", "gauge", [("", st.start_time)])
        i = identity(st)
        fam("flare_build_info", "gauge", [('{image="%s",flare_commit="%s",package="%s",model="%s"}' % (
            i["image"], i["flare_commit"], i["package"], i["model"]), 1)])
        fam("flare_incarnation_info", "gauge", [('{incarnation="%s",recipe_sha256="%s"}' % (
            i["incarnation"], i["recipe_sha256"]), 1)])
    data = ("\n".join(lines) + "\n").encode()
    h.send_response(200)
    h.send_header("content-type", "text/plain; version=0.0.4")
    h.send_header("content-length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def _sglang_lines(st: State, c: dict, active: int) -> list[str]:
    """The exposition of SGLang 0.5.23 for these counters (its metrics_collector.py: names, types, labels, HELP)."""
    sched = '{model_name="glm",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"}'
    finished = c["stop"] + c["length"]
    used = sum(st.cache.values())
    out = []
    for name, kind, helptext, samples in (
        ("sglang:num_running_reqs", "gauge", "The number of running requests.", [(sched, active)]),
        ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", [(sched, 0)]),
        ("sglang:hicache_host_used_tokens", "gauge", "Number of tokens currently used in the host KV cache.", [(sched, used)]),
        ("sglang:hicache_host_total_tokens", "gauge", "Total capacity of the host KV cache in tokens.",
         [(sched, 4096 * st.cfg["cache_entries"])]),
        ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
         [('{model_name="glm",is_streaming="true"}', c["prompt"])]),
        ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
         [('{model_name="glm",is_streaming="true"}', c["generation"])]),
        ("sglang:num_requests_total", "counter", "Number of requests processed.",
         [('{model_name="glm",is_streaming="true"}', finished)]),
        ("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens by source (device/host/storage).",
         [('{model_name="glm",cache_source="device"}', c["gpu_reused"]), ('{model_name="glm",cache_source="host"}', c["reused"])]),
    ):
        out += [f"# HELP {name} {helptext}", f"# TYPE {name} {kind}", *(f"{name}{labels} {v}" for labels, v in samples)]
    out += ["# HELP sglang:queue_time_seconds Histogram of queueing time in seconds.",
            "# TYPE sglang:queue_time_seconds histogram",
            f'sglang:queue_time_seconds_bucket{{le="+Inf",{sched[1:]} {finished}',
            f"sglang:queue_time_seconds_count{sched} {finished}", f"sglang:queue_time_seconds_sum{sched} {0.001 * finished}"]
    if not st.cfg.get("no_start_time"):
        out += ["# TYPE process_start_time_seconds gauge", f"process_start_time_seconds {st.start_time}"]
    return out


# --- manager ---------------------------------------------------------------------------------

def r_recipe(h, _raw, name: str) -> None:
    st: State = h.server.state
    if name not in st.recipes:
        return h.error(404, "not_found", f"no recipe {name}")
    h.send_json({"name": name, "sha256": st.sha(name), "content_b64": base64.b64encode(st.recipes[name]).decode()})


def r_state(h, _raw) -> None:
    st: State = h.server.state
    if st.cfg.get("echo_token"):  # a careless host: its error names the credential it was sent
        presented = h.headers.get("Authorization", "")
        return h.error(503, f"unavailable for {presented}", f"manager busy; your credentials were {presented}")
    loaded = None if st.loaded is None else {"recipe": st.loaded, "sha256": st.sha(st.loaded),
                                             "incarnation": f"c{st.incarnation}"}
    st.state_reads += 1
    # busy: someone else's load or unload runs (from the n-th read on: one that starts after a site check)
    busy = st.starting or st.cfg.get("manager_busy_from") is not None and st.state_reads >= st.cfg["manager_busy_from"]
    h.send_json({"loaded": loaded, "busy": busy})


def _recipe_arg(h, raw: bytes) -> tuple[dict, str] | None:
    st: State = h.server.state
    body = json.loads(raw or b"{}")
    name = body.get("recipe")
    if name not in st.recipes:
        h.error(404, "not_found", f"no recipe {name}")
        return None
    if body.get("sha256") != st.sha(name):
        h.error(409, "conflict", "sha256 does not match the stored bytes")
        return None
    return body, name


def r_preview(h, raw) -> None:
    got = _recipe_arg(h, raw)
    if got is not None:
        body, name = got
        h.send_json({"ok": True, "steps": ["stop", "release"] if body.get("op") == "unload" else ["start", "ready"]})


def r_load(h, raw) -> None:
    got = _recipe_arg(h, raw)
    if got is None:
        return
    st: State = h.server.state
    if got[1] == st.cfg["incumbent"] and time.monotonic() - st.unloaded_at < st.cfg.get("busy_after_unload_s", 0):
        return h.error(503, "unavailable", "the manager is still releasing the last engine's memory")
    st.loads += 1
    st.starting = st.loads == st.cfg.get("hang_load")  # the n-th load's engine never becomes healthy
    if st.starting:
        threading.Event().wait()  # never answers; the manager stays busy until the next load
    st.loading_incumbent = got[1] == st.cfg["incumbent"]
    time.sleep(st.cfg.get("load_delay_s", 0))
    with st.lock:
        st.loading_incumbent = False
        st.loaded = got[1]
        st.incarnation += 1
        if not st.cfg.get("trace_survives_load"):
            st.trace = False
        kept = st.cache if st.cfg.get("external_cache") else None
        st._reset()
        if kept is not None:  # the store outlives the engine: the new incarnation starts with what it holds
            st.cache = kept
        if st.cfg.get("sglang"):  # SGLang's warm-up, counted as any generation: one request, 7 prompt and 8 new tokens
            st.c.update(length=1, prompt=7, generation=8)
        if st.cfg.get("admit_on_incumbent_load") and got[1] == st.cfg["incumbent"]:
            st.admitted = True  # a router that readmits the backend by itself as soon as it serves again
        answer = {"incarnation": f"c{st.incarnation}"}
        if st.cfg.get("hang_incumbent_reload") and got[1] == st.cfg["incumbent"]:
            st.hung = st.incarnation
        if got[1] == st.cfg["incumbent"]:
            st.incumbent_back = time.monotonic()
        if st.cfg.get("crash_after_load") == answer["incarnation"]:
            # the engine died as its load was answered: nothing serves, /health answers 503. Before the answer
            # goes out, so that no read the answer lets the daemon send can find it still loaded
            st.loaded = None
    h.send_json(answer)


def r_unload(h, raw) -> None:
    got = _recipe_arg(h, raw)
    if got is None:
        return
    st: State = h.server.state
    if st.loaded != got[1]:
        return h.error(409, "conflict", "that recipe is not loaded")
    st.loaded = None
    st.unloaded_at = time.monotonic()
    h.send_json({})


# --- router, monitoring, GPU ----------------------------------------------------------------

def backend(st: State) -> dict:
    # `naive_inflight`: an adapter that reports the engine's running requests, direct ones included
    inflight = st.active if st.cfg.get("naive_inflight") else st.cfg.get("inflight", 0)  # `inflight`: any answer
    return {"id": "primary", "url": st.cfg.get("serving_url", ""), "admitted": st.admitted, "inflight": inflight}


def r_backends(h, _raw) -> None:
    if flaky(h.server.state, "router"):
        return h.error(503, "unavailable", "the router is reloading")
    live = backend(h.server.state)
    # `stale_backend`: a second entry under the same id, admitted (a router whose view kept an old one)
    stale = [{**live, "admitted": True}] if h.server.state.cfg.get("stale_backend") else []
    h.send_json({"config_sha256": hashlib.sha256(b"primary").hexdigest(), "backends": [live, *stale]})


def r_backend_op(h, _raw, rest: str) -> None:
    st: State = h.server.state
    bid, _, op = rest.partition("/")
    if bid != "primary" or op not in ("quiesce", "readmit"):
        return h.error(404, "not_found", rest)
    if op == "readmit" and st.cfg.get("readmit_ignored"):  # acknowledged as done, the backend left out
        return h.send_json({**backend(st), "admitted": True})
    if op == "readmit" and st.cfg.get("readmit_applied_after_s"):  # acknowledged now, applied later
        threading.Timer(st.cfg["readmit_applied_after_s"], lambda: setattr(st, "admitted", True)).start()
        return h.send_json({**backend(st), "admitted": True})
    st.admitted = op == "readmit"
    h.send_json(backend(st))


def r_targets(h, _raw) -> None:
    st: State = h.server.state
    lagging = st.incumbent_back is not None and time.monotonic() - st.incumbent_back < st.cfg.get("monitoring_lag_s", 0)
    h.send_json({"targets": [{"id": "primary", "url": st.cfg.get("serving_url", ""), "registered": True,
                              "healthy": st.loaded is not None and not lagging}]})


def r_gpu(h, _raw) -> None:
    st: State = h.server.state
    silent = st.cfg.get("gpu_silent")
    if silent and st.chats >= silent["after_chats"]:
        since = st.__dict__.setdefault("gpu_silent_since", time.monotonic())
        if time.monotonic() - since < silent["for_s"]:
            return h.error(503, "unavailable", "the GPU view is not answering")
    gpus = st.gpus()
    if st.loading_incumbent and st.cfg.get("gpu_memory_on_load"):
        gpus = [{**g, "memory_used_bytes": st.cfg["gpu_memory_on_load"]} for g in gpus]
    h.send_json({"gpus": gpus, "xid_events": []})


ROUTES = {
    ("serving", "GET", "/health"): r_health,
    ("serving", "GET", "/flare/v1/identity"): r_identity,
    ("serving", "POST", "/flare/v1/trace"): r_trace,
    ("serving", "GET", "/openapi.json"): r_openapi,
    ("serving", "POST", "/v1/chat/completions"): generate,
    ("serving", "GET", "/metrics"): r_metrics,
    ("manager", "GET", "/manager/v1/state"): r_state,
    ("manager", "POST", "/manager/v1/preview"): r_preview,
    ("manager", "POST", "/manager/v1/load"): r_load,
    ("manager", "POST", "/manager/v1/unload"): r_unload,
    ("router", "GET", "/router/v1/backends"): r_backends,
    ("router", "POST", "/v1/chat/completions"): lambda h, raw: generate(h, raw, routed=True),
    ("monitoring", "GET", "/monitoring/v1/targets"): r_targets,
    ("gpu", "GET", "/sim/v1/gpu"): r_gpu,
}
PREFIXES = {
    ("manager", "GET", "/manager/v1/recipes/"): r_recipe,
    ("router", "POST", "/router/v1/backends/"): r_backend_op,
}


def serve(cfg: dict) -> dict[str, str]:
    state = State(cfg)
    urls = {}
    tls = None
    if cfg.get("tls"):  # every service over https, with the certificate and key the config names
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cfg["tls"]["cert"], cfg["tls"]["key"])
    for svc in SERVICES:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), build(state, svc))
        srv.daemon_threads = True
        srv.state = state  # type: ignore[attr-defined]
        if tls is not None:
            # the handshake in the request's own thread, not in the accept loop every service shares
            srv.socket = tls.wrap_socket(srv.socket, server_side=True, do_handshake_on_connect=False)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        urls[svc] = f"{'https' if tls else 'http'}://127.0.0.1:{srv.server_address[1]}"
    cfg["serving_url"] = urls["serving"]
    return urls


def main(argv: list[str]) -> int:
    cfg = json.loads(open(argv[0]).read())
    urls = serve(cfg)
    print(json.dumps(urls), flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
