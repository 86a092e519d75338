"""What bounds a host's answers, so that no host can hold a window or this daemon's memory: a generation's stall
watchdog (no event for timing.stall_s), its events past the body's max_tokens, and every answer's bytes."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import NamedTuple

import anyio
import httpx
import msgspec

from flare_diag.daemon.hosts.errors import MAX_ANSWER_BYTES, ActionFailed


class StallBound(NamedTuple):
    """How long a generation's stream may give no event: on the loop's clock, in window seconds, and as the
    plan states it (less than the window's bound where a scaled clock's real-seconds floor raised it)."""

    real_s: float
    window_s: float
    plan_s: float

    def words(self) -> str:
        raised = f" {self.plan_s:g} s, raised by the scaled clock's real-seconds floor" if self.window_s > self.plan_s else ""
        return f"no event for {self.window_s:g} s (timing.stall_s{raised})"


# Events a stream may give beyond its body's max_tokens: the role's, the finish's and usage's own, and slack. An
# engine gives at most one event a token (vLLM, SGLang, llama.cpp's server; more tokens an event with a stream
# interval or speculative decoding), so a stream past it has generated beyond max_tokens: it is cut there rather
# than left to run to the request's deadline. Streams that carry several tokens an event are judged by their usage.
EVENTS_BEYOND_MAX_TOKENS = 32


class _Asked(msgspec.Struct):
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


def most_events(body: bytes) -> float:
    """The most events a stream of this body may give (inf when it states no max_tokens)."""
    try:
        asked = msgspec.json.decode(body, type=_Asked)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return math.inf
    limit = asked.max_tokens or asked.max_completion_tokens
    return limit + EVENTS_BEYOND_MAX_TOKENS if limit and limit > 0 else math.inf


class Watchdog:
    """A stream's stall deadline, moved on by its events: it fires after at least the bound with no event, and at
    most a tenth more. (Moving a cancel scope's deadline costs about as much as parsing the event, so it is moved
    only once a tenth of the bound has passed since it last was.)"""

    def __init__(self, stall: StallBound | None) -> None:
        self.bound = stall.real_s if stall is not None else math.inf
        self.slack = self.bound / 10
        self.moved = anyio.current_time()
        self.scope = anyio.CancelScope(deadline=self.moved + self.bound + self.slack)

    def event(self) -> None:
        now = anyio.current_time()
        if now - self.moved >= self.slack:  # the last event before the deadline came less than a slack after `moved`
            self.moved = now
            self.scope.deadline = now + self.bound + self.slack


class Capped(httpx.AsyncByteStream):
    """A stream's bytes, refused once they pass MAX_ANSWER_BYTES: a line that never ends is not held whole."""

    def __init__(self, inner: httpx.SyncByteStream | httpx.AsyncByteStream) -> None:
        assert isinstance(inner, httpx.AsyncByteStream)  # an async client's
        self._inner, self._total = inner, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._total += len(chunk)
            if self._total > MAX_ANSWER_BYTES:
                raise ActionFailed("malformed_transport", f"chat completion: an answer of more than {MAX_ANSWER_BYTES} "
                                                          f"bytes (at most that many are read)")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


# Framing of an answer as it came over the wire, not of the bytes `bounded` hands on (already decoded, whole)
_FRAMING = (b"content-encoding", b"content-length", b"transfer-encoding")


async def bounded(client: httpx.AsyncClient, method: str, url: str, **kw) -> httpx.Response:
    """A request whose answer is read as it comes and refused once it passes MAX_ANSWER_BYTES (decoded, so a
    compressed bomb too): a host that streams an endless answer costs this daemon that much, not its memory."""
    async with client.stream(method, url, **kw) as resp:
        body = bytearray()
        async for chunk in resp.aiter_bytes():
            body += chunk
            if len(body) > MAX_ANSWER_BYTES:
                raise ActionFailed("malformed_transport", f"{method} {httpx.URL(url).path}: an answer of more than "
                                                          f"{MAX_ANSWER_BYTES} bytes (at most that many are read)")
    headers = [(k, v) for k, v in resp.headers.raw if k.lower() not in _FRAMING]
    return httpx.Response(resp.status_code, headers=headers, content=bytes(body), request=resp.request)
