"""The HTTP host: the window's actions (daemon/hosts/actions.py) carried out over the site's services with
httpx and httpx-sse, its clients and the stamped generation stream."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
from httpx_sse import ServerSentEvent, aconnect_sse

from flare_diag.daemon.hosts.actions import Actions
from flare_diag.daemon.hosts.bounds import EVENTS_BEYOND_MAX_TOKENS, Capped, StallBound, Watchdog, bounded, most_events
from flare_diag.daemon.hosts.errors import ActionFailed, answer_object, classify_response
from flare_diag.daemon.hosts.fixture import Fixture
from flare_diag.daemon.hosts.host import build_host
from flare_diag.daemon.hosts.httpclient import STALE_CONNECTION, host_client
from flare_diag.daemon.hosts.prometheus import Prometheus
from flare_diag.daemon.hosts.site import Site, SiteProfile
from flare_diag.daemon.hosts.stamping import SendClock, StampingTransport, read_ns, read_source, stamped_transport
from flare_diag.daemon.hosts.stream_errors import stream_error

RESPONSE_CAP = 4096

# Finish reasons of a stream the engine ended itself, not a generation that stopped or reached max_tokens: SGLang
# streams "abort" as an ordinary chunk for a graceful abort (its /abort_request, a session's clean-up:
# python/sglang/srt/entrypoints/openai/serving_chat.py), vLLM's FinishReason has "abort" and "error"
# (vllm/v1/engine/__init__.py; "error" is meant to reach a client as a 500). Such an answer is a failed request.
ENDED_BY_ENGINE = ("abort", "error")


class Target(Actions):
    """A site's host over HTTP: the adapters `build_host` picks from its profile, given this target's
    calls (its clients, the site's tokens, its retries)."""

    def __init__(self, site: Site, fixtures: dict[str, Fixture], plan_sha256: str,
                 recipe_dir: Path | None = None) -> None:
        self.p = site.profile
        timeout = httpx.Timeout(600.0, connect=10.0)
        # reads and state-setting calls share a pool (they may be retried once on a fresh connection)
        self.client = host_client(timeout=timeout, transport=site.transport)
        # generations, loads and unloads each get a connection of their own: one the host may have
        # closed while idle can never be picked for them, and they are never sent twice
        # (their answers' chunks stamped as they are read off the transport, before any parsing)
        inner = site.transport or stamped_transport(_service_urls(site.profile))
        self.fresh = host_client(timeout=timeout, transport=StampingTransport(inner, _now_ns))
        self.tokens = site.tokens
        # the site's Prometheus, which the plan's steady-state guards query (never through the
        # site's transport: a rehearsal's in-process simulator is not where Prometheus lives)
        prometheus = Prometheus(site) if site.profile.steady_state is not None else None
        # the host's five roles behind their ports, chosen from the profile (daemon/hosts/host.py)
        super().__init__(build_host(site, self, self._h("serving")), site, fixtures, plan_sha256, recipe_dir, prometheus)
        # set by the runner from the plan (timing.stall_s); None: a stream is bounded by its request's deadline only
        self.stall: StallBound | None = None

    async def close(self) -> None:
        await self.client.aclose()
        await self.fresh.aclose()
        if self.prometheus is not None:
            await self.prometheus.close()
        await self.manager.close()
        await self.host.gpu.close()

    def _h(self, svc: str) -> dict:
        tok = self.tokens.get(svc)
        return {"Authorization": f"Bearer {tok}"} if tok else {}

    async def _retrying(self, method: str, url: str, **kw) -> httpx.Response:
        """An idempotent call: once more on a new connection if the pooled one was stale."""
        try:
            return await bounded(self.client, method, url, **kw)
        except STALE_CONNECTION:
            return await bounded(self.fresh, method, url, **kw)

    async def get(self, svc: str, url: str) -> httpx.Response:
        return await self._retrying("GET", url, headers=self._h(svc))

    async def get_json(self, svc: str, url: str, what: str) -> dict:
        r = await self.get(svc, url)
        if r.status_code != 200:
            raise classify_response(r, what)
        return answer_object(r, what)

    async def post_json(self, svc: str, url: str, what: str, body: dict | None = None, once: bool = False) -> dict:
        """POST; `once`: it may change the host (load, unload), so it goes out once on its own connection."""
        if once:
            r = await bounded(self.fresh, "POST", url, headers=self._h(svc), json=body or {})
        else:
            r = await self._retrying("POST", url, headers=self._h(svc), json=body or {})
        if r.status_code != 200:
            raise classify_response(r, what)
        return answer_object(r, what)

    async def stream_chat(self, svc: str, url: str, body: bytes) -> dict:
        """Streams one chat completion of the exact body bytes and returns the RequestDone fields (raises
        on abort-class errors): its times from the kernel's read stamps of its bytes."""
        answer = _Answer()
        resp = await self._bounded_stream(svc, url, body, answer, "chat completion")
        return {"outcome": "ok", "request_id": resp.headers.get("x-request-id"), "status_code": resp.status_code,
                **answer.fields()}

    async def stream_short(self, svc: str, url: str, body: bytes, what: str) -> dict:
        """A short generation (a preflight), streamed under the bounds every generation has: its finish reason
        and the host's request id. Streamed because an engine that holds a request says nothing until a whole
        non-streamed answer is ready: only a stream's events can show it stalled before the call's deadline."""
        answer = _Finish()
        resp = await self._bounded_stream(svc, url, body, answer, what)
        if not answer.done:
            raise ActionFailed("malformed_transport", f"{what}: the stream ended without [DONE]")
        return {"finish_reason": answer.finish, "request_id": resp.headers.get("x-request-id")}

    async def _bounded_stream(self, svc: str, url: str, body: bytes, answer: _Answer | _Finish, what: str) -> httpx.Response:
        """One generation's stream, sent once on a connection of its own, each event handed to `answer`. A stream
        that gives no event for the stall bound fails as `stalled`, whatever is left of its request's deadline;
        one that goes on past its body's max_tokens (in events) is cut there as `overlong`."""
        clock = SendClock(_now_ns)
        headers = {**self._h(svc), "content-type": "application/json"}
        watchdog = Watchdog(self.stall)
        most = most_events(body)
        with watchdog.scope:
            async with aconnect_sse(self.fresh, "POST", url, content=body, headers=headers,
                                    extensions=clock.extensions()) as es:
                t0 = clock.t0  # its headers went out on an open connection: the connect is not in its times
                resp = es.response
                if resp.status_code != 200:
                    await resp.aread()
                    raise classify_response(resp, what)
                resp.stream = Capped(resp.stream)  # an event's line is held until it ends: bounded, as any answer
                stamp = functools.partial(read_source, resp)
                async for sse in es.aiter_sse():
                    watchdog.event()  # an event with data, not a keep-alive comment
                    # when its bytes were read (or came, where the kernel stamps them), not when they were parsed
                    if answer.event(sse, read_ns(resp, _now_ns) - t0, stamp):
                        break
                    if answer.events > most:  # hung up on: the engine stops generating into a closed stream
                        raise ActionFailed("overlong", f"{what}: the stream went on past {most:,} events for a "
                                                       f"body whose max_tokens is {most - EVENTS_BEYOND_MAX_TOKENS:,}: the "
                                                       f"engine did not stop at it")
        if watchdog.scope.cancelled_caught:
            assert self.stall is not None  # only a bound gives the watchdog a deadline
            raise ActionFailed("stalled", f"{what}: {self.stall.words()}, after {answer.events} event(s)")
        return resp


class _Finish:
    """A short generation's stream as its events come: how many, its finish reason, and whether it ended."""

    def __init__(self) -> None:
        self.events = 0
        self.choices = 0  # chunks that carried a choice: an answer with none is no generation
        self.finish: str | None = None
        self.done = False

    def event(self, sse: ServerSentEvent, _now: int = 0, _stamp: Callable[[], str] | None = None) -> bool:
        """Takes one event; True at [DONE]. Raises the error a stream carries, or malformed_transport."""
        if sse.data == "[DONE]":
            if not self.choices:
                raise ActionFailed("malformed_transport", "chat completion: the answer has no choices")
            self.done = True
            return True
        self.events += 1
        choices = _chunk(sse).get("choices")
        for ch in choices if isinstance(choices, list) else []:
            if isinstance(ch, dict):
                self.choices += 1
                self.finish = ch["finish_reason"] if isinstance(ch.get("finish_reason"), str) else self.finish
        return False


class _Answer:
    """One streamed answer as its events come: what it says (usage, finish, its text's digests), its bytes,
    and when (send-relative ns: its first byte, first and last token, and end)."""

    def __init__(self) -> None:
        self.first_byte: int | None = None
        self.first_token: int | None = None
        self.last_token: int | None = None
        self.first_stamp = ""  # where first_token came from (stamping.read_source)
        self.end: int | None = None  # at [DONE]: when its last bytes came, as its tokens' times
        self.visible = self.reasoning = False
        self.usage: dict | None = None
        self.finish: str | None = None
        self.model = ""  # the model its first chunk that names one names
        self.answer_id = ""  # the completion its first chunk that names one names
        self.events = 0  # its server-sent events so far
        self.digest = hashlib.sha256()
        # the answer itself, its reasoning and its content, without the stream's ids, framing or
        # chunking: what an output-consistency phase compares between a cold answer and a reused one
        self.said_r, self.said_c = hashlib.sha256(), hashlib.sha256()
        self.head = bytearray()
        self.total = 0

    def event(self, sse: ServerSentEvent, now: int, stamp: Callable[[], str]) -> bool:
        """Takes one server-sent event whose bytes came at `now`; True at [DONE]. Raises the error a
        stream carries, or malformed_transport for an event that is not JSON."""
        self.first_byte = self.first_byte if self.first_byte is not None else now
        data = sse.data.encode()
        self.digest.update(data + b"\n")
        self.total += len(data) + 1
        if len(self.head) < RESPONSE_CAP:
            self.head.extend(data[: RESPONSE_CAP - len(self.head)])
        if sse.data == "[DONE]":
            self.end = now
            return True
        chunk = _chunk(sse)
        self.events += 1
        self._one_answer(chunk)
        for ch in chunk.get("choices") or []:
            self._choice(ch, now, stamp)
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        return False

    def _one_answer(self, chunk: dict) -> None:
        """Every chunk of one answer names the same completion ("Each chunk has the same ID": OpenAI's chat
        completion chunk object, which vLLM, SGLang and llama.cpp's server keep) and the same model. Chunks
        naming another are a second answer spliced into the stream (a router that resumed the generation
        on another backend): its times and text are no one generation's, so the answer is malformed."""
        self.answer_id = self._held("id", self.answer_id, chunk.get("id"))
        self.model = self._held("model", self.model, chunk.get("model"))

    def _held(self, field: str, first: str, said: object) -> str:
        """What the stream names `field` from now on: its first name; another one is a second answer."""
        if not isinstance(said, str) or not said or not first:
            return first or (said if isinstance(said, str) else "")
        if said != first:
            raise ActionFailed("malformed_transport", f"chat completion: event {self.events} names {field} "
                               f"{said[:64]!r}, the stream's first named {first[:64]!r}: two answers in one stream")
        return first

    def _choice(self, ch: dict, now: int, stamp: Callable[[], str]) -> None:
        said, thought = delta_text(ch.get("delta") or {})
        self.visible, self.reasoning = self.visible or bool(said), self.reasoning or bool(thought)
        self.said_r.update(thought.encode())
        self.said_c.update(said.encode())
        if said or thought:
            if self.first_token is None:
                self.first_token, self.first_stamp = now, stamp()
            self.last_token = now
        if ch.get("finish_reason"):
            self.finish = ch["finish_reason"]

    def fields(self) -> dict:
        """Its RequestDone fields, once the stream has ended; malformed_transport without [DONE] or usage."""
        if self.end is None:
            raise ActionFailed("malformed_transport", "chat completion: the stream ended without [DONE]")
        if self.finish in ENDED_BY_ENGINE:  # before the usage: an engine that gave up on it may send none
            raise ActionFailed("engine_error", f"chat completion: the engine ended it itself (finish_reason "
                                               f"{self.finish!r}, after {self.events} event(s)): no whole generation")
        if self.usage is None:
            raise ActionFailed("malformed_transport", "chat completion: no usage before [DONE]")
        u = self.usage
        return dict(finish_reason=self.finish, visible_output=self.visible,
                    reasoning_only=self.reasoning and not self.visible, prompt_tokens=u.get("prompt_tokens"),
                    completion_tokens=u.get("completion_tokens"),
                    cached_tokens=(u.get("prompt_tokens_details") or {}).get("cached_tokens"),
                    first_byte_ns=self.first_byte, first_token_ns=self.first_token, first_token_stamp=self.first_stamp,
                    last_token_ns=self.last_token, end_ns=self.end, response_bytes=self.total,
                    response_sha256=self.digest.hexdigest(),
                    output_sha256=hashlib.sha256(self.said_r.digest() + self.said_c.digest()).hexdigest(),
                    response_head=self.head.decode("utf-8", "replace"), model_answered=self.model,
                    answer_id=self.answer_id)


def _chunk(sse: ServerSentEvent) -> dict:
    """An event's JSON object, or the error it carries raised (the host's words, one line)."""
    try:
        chunk = json.loads(sse.data)
    except (ValueError, RecursionError):
        plain = stream_error(sse.data, "error") if sse.event == "error" else None  # words as plain text
        raise plain or ActionFailed("malformed_transport", "chat completion: a server-sent event is not JSON") from None
    failed = stream_error(chunk, sse.event if sse.event != "message" else None)
    if failed is not None:
        raise failed
    return chunk


# The reasoning channel's field, as each engine streams it: vLLM's DeltaMessage names it `reasoning`
# (vllm/entrypoints/openai/protocol.py; `reasoning_content` before 0.11), SGLang and llama.cpp's
# server `reasoning_content`. Either is reasoning; an engine that sends both sends the same text twice.
REASONING_FIELDS = ("reasoning", "reasoning_content")


def delta_text(delta: dict) -> tuple[str, str]:
    """A stream chunk's (content, reasoning) text; a field that is not a string counts as none."""
    said = delta.get("content")
    thought = next((t for f in REASONING_FIELDS if isinstance(t := delta.get(f), str) and t), "")
    return (said if isinstance(said, str) else ""), thought


def _service_urls(profile: SiteProfile) -> list[str]:
    return [svc.url for name in ("serving", "manager", "router", "monitoring")
            if (svc := getattr(profile, name)) is not None and svc.url]


def _now_ns() -> int:
    """The loop's clock in nanoseconds: the monotonic clock, or a rehearsal's virtual time."""
    return int(anyio.current_time() * 1e9)
