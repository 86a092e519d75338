"""A generation's clock, taken where the bytes move: it starts once the connection is open, and the
answer's chunks are stamped as they are read off the transport (daemon/hosts/stamping.py)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from flare_diag.daemon.hosts.stamping import SendClock, StampingTransport, read_ns


async def _sse_server(first_chunk_delay_s: float) -> tuple[asyncio.AbstractServer, int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        await asyncio.sleep(first_chunk_delay_s)
        data = b"data: {}\n\n"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
        await writer.drain()
        writer.close()
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.asyncio
async def test_a_generations_clock_starts_after_its_connection_is_open():
    server, port = await _sse_server(0.0)
    seen: dict[str, int] = {}
    clock = SendClock(time.monotonic_ns)

    async def trace(name: str, info: dict) -> None:
        seen.setdefault(name, time.monotonic_ns())
        await clock.extensions()["trace"](name, info)
    try:
        async with httpx.AsyncClient() as c:
            async with c.stream("GET", f"http://127.0.0.1:{port}/", extensions={"trace": trace}) as r:
                await r.aread()
    finally:
        server.close()
    assert clock.t0 >= seen["connection.connect_tcp.complete"]  # the connect is before the clock
    assert seen["http11.send_request_headers.started"] <= clock.t0 <= seen["http11.send_request_headers.complete"]


@pytest.mark.asyncio
async def test_an_answers_chunk_is_stamped_when_it_is_read_not_when_it_is_parsed():
    server, port = await _sse_server(0.0)
    try:
        async with httpx.AsyncClient(transport=StampingTransport(httpx.AsyncHTTPTransport(), time.monotonic_ns)) as c:
            async with c.stream("GET", f"http://127.0.0.1:{port}/") as r:
                async for _chunk in r.aiter_bytes():
                    read = time.monotonic_ns()
                    await asyncio.sleep(0.3)  # a busy loop, or a slow parse, before the chunk is looked at
                    assert read_ns(r, time.monotonic_ns) - read < 0.05e9
    finally:
        server.close()


def test_a_response_that_was_not_stamped_reads_the_clock_now():
    r = httpx.Response(200, content=b"")
    assert read_ns(r, lambda: 42) == 42


@pytest.mark.asyncio
async def test_a_chunk_read_later_is_never_stamped_before_one_read_earlier():
    # the first read has no kernel stamp (the clock at its read, 1,000), the second is stamped as received
    # 300 ns before its read at 1,100: 800 would put the later chunk before the earlier one
    from flare_diag.daemon.hosts.stamping import StampedStream

    class Inner(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield b"a"
            yield b"b"

    class Network:
        ages = iter([None, 300])

        def received_age_ns(self) -> int | None:
            return next(self.ages)
    clock = iter([1_000, 1_100])
    stream = StampedStream(Inner(), lambda: next(clock), Network())
    stamps = [stream.last_read_ns async for _chunk in stream]
    assert stamps == [1_000, 1_000]


class _TwoChunks(httpx.AsyncByteStream):
    async def __aiter__(self):
        yield b"a"
        yield b"b"


class _Network:
    def __init__(self, ages: list[int | None]) -> None:
        self.ages = iter(ages)

    def received_age_ns(self) -> int | None:
        return next(self.ages)


@pytest.mark.parametrize(("network", "sources"), [
    (_Network([50, 60]), ["kernel", "kernel"]),  # every read stamped by the kernel
    (_Network([None, None]), ["read", "read"]),  # a connection the kernel does not stamp (https)
    (_Network([None, 300]), ["read", "read"]),  # the stamped one would come before the earlier read: held
    (None, ["", ""]),  # a host in this process: no bytes crossed a network
])
@pytest.mark.asyncio
async def test_a_chunks_time_says_whether_the_kernel_stamped_it(network, sources):
    from flare_diag.daemon.hosts.stamping import StampedStream
    clock = iter([1_000, 1_100])
    stream = StampedStream(_TwoChunks(), lambda: next(clock), network)
    assert [stream.last_source async for _chunk in stream] == sources
