"""When a generation was sent and when its answer's bytes came, taken where the bytes move: the clock
starts as the request's headers go out on a connection already open (httpcore's trace), and each chunk
of the answer is stamped when the kernel received its bytes (daemon/hosts/rxstamps.py), or, where it
gives no stamp, as it is read off the transport, before it is decoded or parsed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpcore
import httpx

from flare_diag.daemon.hosts.httpclient import tls_context
from flare_diag.daemon.hosts.rxstamps import backend_for

READ_STAMP = "flare_diag.read_stamp"  # the response extension that holds its StampedStream


class StampedStream(httpx.AsyncByteStream):
    """A response body that notes the clock as each chunk is read off the transport, and where that time
    came from (`last_source`): "kernel", its bytes' receive stamp; "read", the moment they were read (a
    connection the kernel does not stamp); "" for a host in this process, whose bytes cross no network."""

    def __init__(self, inner: httpx.AsyncByteStream, clock: Callable[[], int], network: object = None) -> None:
        self._inner, self._clock = inner, clock
        self._age = getattr(network, "received_age_ns", None)  # a kernel-stamped connection's
        self._unstamped = "read" if network is not None else ""
        self.last_read_ns: int | None = None
        self.last_source = ""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            now = self._clock()
            age = self._age() if self._age is not None else None
            read = now - age if age is not None else now
            # TCP delivers in order, so a chunk read later was never received earlier: a read the kernel
            # did not stamp takes the clock at its read (later than its bytes came), and the next, stamped,
            # read must not then seem to come before it (a first token after the last, on a real vLLM)
            if self.last_read_ns is None or read >= self.last_read_ns:
                self.last_read_ns, self.last_source = read, ("kernel" if age is not None else self._unstamped)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class StampingTransport(httpx.AsyncBaseTransport):
    """Another transport whose response bodies are StampedStreams (in the response's extensions)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, clock: Callable[[], int]) -> None:
        self._inner, self._clock = inner, clock

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        resp = await self._inner.handle_async_request(request)
        stream = StampedStream(resp.stream, self._clock, resp.extensions.get("network_stream"))  # type: ignore[arg-type]  # an async transport's
        return httpx.Response(resp.status_code, headers=resp.headers, stream=stream,
                              extensions={**resp.extensions, READ_STAMP: stream})

    async def aclose(self) -> None:
        await self._inner.aclose()


class SendClock:
    """One request's t0: as its headers start out on an open connection, so that a connect, a DNS lookup
    or a TLS handshake is not counted in its time to first token; on a transport with no trace (the
    in-process simulator) the moment the call began. Pass `extensions()` with the request."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self.t0 = clock()

    def extensions(self) -> dict:
        return {"trace": self._trace}

    async def _trace(self, name: str, _info: dict) -> None:
        if name.endswith("send_request_headers.started"):  # http11. or http2.
            self.t0 = self._clock()


def read_ns(response: httpx.Response, clock: Callable[[], int]) -> int:
    """When the answer's latest chunk was read off the transport (the clock now, if not stamped)."""
    stamp = response.extensions.get(READ_STAMP)
    last = stamp.last_read_ns if isinstance(stamp, StampedStream) else None
    return last if last is not None else clock()


def read_source(response: httpx.Response) -> str:
    """Where read_ns's time came from: "kernel", "read", or "" (StampedStream.last_source)."""
    stamp = response.extensions.get(READ_STAMP)
    return stamp.last_source if isinstance(stamp, StampedStream) else ""


def stamped_transport(urls: list[str]) -> httpx.AsyncHTTPTransport:
    """A transport for generations, loads and unloads: no connection kept between requests, and, where
    every URL is plain http and the kernel gives receive stamps, connections that carry them."""
    transport = httpx.AsyncHTTPTransport(verify=tls_context(), limits=httpx.Limits(max_keepalive_connections=0))
    backend = backend_for(urls)
    if backend is not None:
        # httpx's transport takes no network backend of its own; its pool is httpcore's, built the
        # same way with one (tests/test_rxstamps.py checks that answers still come through it)
        transport._pool = httpcore.AsyncConnectionPool(ssl_context=tls_context(), max_connections=100,
                                                       max_keepalive_connections=0, keepalive_expiry=5.0,
                                                       network_backend=backend)
    return transport
