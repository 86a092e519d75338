"""A generation's stream is bounded, against a real loopback server: one that gives no event for the stall bound
fails as `stalled` (a keep-alive comment is not an event; one that keeps giving events outlives the bound), and
one that goes on past its body's max_tokens is cut there as `overlong`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from flare_diag.daemon.hosts.errors import ActionFailed
from flare_diag.daemon.hosts.site import sim_site
from flare_diag.daemon.hosts.bounds import StallBound
from flare_diag.daemon.hosts.target import Target

Write = Callable[[bytes], Awaitable[None]]
CHUNK = {"id": "c-1", "model": "m", "choices": [{"index": 0, "delta": {"content": " ok"}, "finish_reason": None}]}
LAST = {"id": "c-1", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


def _event(obj: object) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


async def _serving(answer: Callable[[Write], Awaitable[None]]) -> AsyncIterator[str]:
    """An HTTP/1.1 server on loopback whose every POST is answered by `answer` writing a chunked SSE body."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n")) if k.lower() == b"content-length")
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

        async def write(data: bytes) -> None:
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()
        try:
            await answer(write)
            await write(b"")
        finally:
            writer.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _on_target(answer: Callable[[Write], Awaitable[None]], stall_s: float,
                     call: Callable[[Target, str], Awaitable[dict]]) -> dict:
    """`call(target, chat URL)` on a target bound by `stall_s`, against a server answering with `answer`."""
    async for url in _serving(answer):
        target = Target(sim_site(url, "t0ken"), {}, "")
        target.stall = StallBound(stall_s, stall_s, stall_s)
        try:
            return await call(target, f"{url}/v1/chat/completions")
        finally:
            await target.close()
    raise AssertionError("no server")


async def _chat(answer: Callable[[Write], Awaitable[None]], stall_s: float, body: bytes = b"{}") -> dict:
    return await _on_target(answer, stall_s, lambda target, url: target.stream_chat("serving", url, body))


async def test_a_stream_that_only_sends_keep_alive_comments_after_its_first_event_stalls_at_the_bound():
    async def answer(write: Write) -> None:
        await write(_event(CHUNK))
        for _ in range(600):  # a proxy's pings in front of an engine that gives nothing (a minute at most)
            await write(b": ping\n\n")
            await asyncio.sleep(0.1)
    with pytest.raises(ActionFailed) as got:
        await _chat(answer, 1.0)
    assert got.value.error == "stalled"
    assert str(got.value).endswith("chat completion: no event for 1 s (timing.stall_s), after 1 event(s)")


async def test_a_stream_whose_events_keep_coming_outlives_the_stall_bound():
    async def answer(write: Write) -> None:
        for _ in range(16):  # 4.8 s in all, no gap near the bound (a loaded machine's loop may lag a second)
            await write(_event(CHUNK))
            await asyncio.sleep(0.3)
        await write(_event(LAST) + _event(b"[DONE]"))
    done = await _chat(answer, 4.0)
    assert done["outcome"] == "ok" and done["completion_tokens"] == 2


def test_a_stall_bound_raised_by_a_scaled_clock_says_so():
    assert StallBound(5.0, 300.0, 3.0).words() == ("no event for 300 s (timing.stall_s 3 s, raised by the scaled "
                                                    "clock's real-seconds floor)")
    assert StallBound(120.0, 120.0, 120.0).words() == "no event for 120 s (timing.stall_s)"


async def _tokens(write: Write, n: int) -> None:
    for _ in range(n):
        await write(_event(CHUNK))
    await write(_event(LAST) + _event(b"[DONE]"))


async def test_a_stream_that_goes_on_past_its_bodys_max_tokens_is_cut_as_overlong():
    with pytest.raises(ActionFailed) as got:
        await _chat(lambda write: _tokens(write, 500), 30.0, b'{"max_tokens": 4, "stream": true}')
    assert got.value.error == "overlong"
    assert str(got.value).endswith("the stream went on past 36 events for a body whose max_tokens is 4: the engine "
                                   "did not stop at it")


async def test_a_stream_of_a_body_that_states_no_max_tokens_is_not_cut_by_its_events():
    done = await _chat(lambda write: _tokens(write, 500), 30.0, b'{"stream": true}')
    assert done["outcome"] == "ok"


async def _endless_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A GET answered with a chunked body that does not end: twice the daemon's cap in 1 MiB chunks, then
    nothing more until its client hangs up (so that a client that held it all holds 128 MiB, not the machine)."""
    from flare_diag.daemon.hosts.errors import MAX_ANSWER_BYTES
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n")
    chunk = b"x" * (1 << 20)
    try:
        for _ in range(2 * MAX_ANSWER_BYTES // len(chunk)):
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
        await reader.read()  # the client's hang-up
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def test_a_read_whose_answer_never_ends_is_refused_past_the_answer_cap_not_held_whole():
    import anyio

    from flare_diag.daemon.hosts.errors import MAX_ANSWER_BYTES
    server = await asyncio.start_server(_endless_answer, "127.0.0.1", 0)
    async with server:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        target = Target(sim_site(url, "t0ken"), {}, "")
        try:
            with anyio.fail_after(60), pytest.raises(ActionFailed) as got:  # before: read on, all of it held
                await target.get("serving", f"{url}/metrics")
        finally:
            await target.close()
    assert got.value.error == "malformed_transport"
    assert str(got.value) == f"GET /metrics: an answer of more than {MAX_ANSWER_BYTES} bytes (at most that many are read)"


async def test_a_stream_whose_event_never_ends_is_refused_past_the_answer_cap_not_held_whole():
    import anyio

    from flare_diag.daemon.hosts.errors import MAX_ANSWER_BYTES

    async def answer(write: Write) -> None:
        await write(b"data: ")
        for _ in range(2 * MAX_ANSWER_BYTES // (1 << 20)):  # one line, twice the cap, then nothing more
            await write(b"x" * (1 << 20))
        await asyncio.sleep(60)
    with anyio.fail_after(60), pytest.raises(ActionFailed) as got:  # before: held until the stall bound
        await _chat(answer, 30.0)
    assert got.value.error == "malformed_transport"
    assert str(got.value) == f"chat completion: an answer of more than {MAX_ANSWER_BYTES} bytes (at most that many are read)"


async def test_a_stream_the_engine_ended_as_abort_without_usage_is_its_failed_request_not_a_malformed_one():
    async def answer(write: Write) -> None:
        await write(_event(CHUNK))
        await write(_event({**LAST, "choices": [{"index": 0, "delta": {}, "finish_reason": "abort"}], "usage": None})
                    + _event(b"[DONE]"))
    with pytest.raises(ActionFailed) as got:
        await _chat(answer, 30.0)
    assert got.value.error == "engine_error"
    assert str(got.value).endswith("the engine ended it itself (finish_reason 'abort', after 2 event(s)): no whole generation")


async def test_a_preflight_held_by_its_engine_after_its_first_event_stalls_at_the_bound_naming_the_preflight():
    async def answer(write: Write) -> None:
        await write(_event(CHUNK))
        await asyncio.sleep(60)  # the engine holds the rest (a minute at most)
    body = b'{"max_tokens": 8, "stream": true}'
    with pytest.raises(ActionFailed) as got:
        await _on_target(answer, 1.0, lambda target, url: target.stream_short("serving", url, body, "direct preflight"))
    assert got.value.error == "stalled"
    assert str(got.value).endswith("direct preflight: no event for 1 s (timing.stall_s), after 1 event(s)")
