"""The kernel's receive stamps on a generation's connection (daemon/hosts/rxstamps.py): a chunk's time is
when its bytes reached this machine, however late a busy loop reads them."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from flare_diag.daemon.hosts import rxstamps
from flare_diag.daemon.hosts.stamping import StampingTransport, read_ns, stamped_transport

needs_stamps = pytest.mark.skipif(not rxstamps.supported(), reason="the kernel gives no TCP receive stamps here")


class _SlowBody:
    """A one-connection HTTP server on its own thread: headers at once, the body when `release` is set;
    `sent` is set once the body's bytes are handed to the kernel."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.release, self.sent = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(4096)
            body = b"data: {}\n\n"
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(body))
            self.release.wait(30)
            conn.sendall(body)
            self.sent.set()
            time.sleep(0.5)  # the client reads before the connection closes

    def close(self) -> None:
        self.release.set()
        self.thread.join(30)
        self.listener.close()


@needs_stamps
@pytest.mark.asyncio
async def test_a_chunk_read_late_by_a_blocked_loop_keeps_the_time_its_bytes_arrived():
    assert rxstamps.hold_stamping(wait_s=30)  # however late a busy machine runs the kernel's work item
    server = _SlowBody()
    transport = StampingTransport(stamped_transport(["http://127.0.0.1"]), time.monotonic_ns)
    try:
        async with httpx.AsyncClient(transport=transport) as c:
            async with c.stream("GET", f"http://127.0.0.1:{server.port}/") as r:
                server.release.set()
                assert server.sent.wait(30)
                arrived_by = time.monotonic_ns()
                time.sleep(0.3)  # noqa: ASYNC251 (the point: the loop is busy, as with another stream, a scrape, a commit)
                body = await r.aread()
                assert body == b"data: {}\n\n"
                assert read_ns(r, time.monotonic_ns) <= arrived_by  # the kernel's time, not the late read's
    finally:
        server.close()


@needs_stamps
@pytest.mark.asyncio
async def test_a_stamped_connection_refused_is_httpx_connect_error():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    async with httpx.AsyncClient(transport=stamped_transport(["http://127.0.0.1"])) as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(f"http://127.0.0.1:{port}/")


@needs_stamps
@pytest.mark.asyncio
async def test_a_stamped_connection_that_stays_silent_is_httpx_read_timeout():
    server = _SlowBody()
    try:
        async with httpx.AsyncClient(transport=stamped_transport(["http://127.0.0.1"]), timeout=httpx.Timeout(5, read=0.2)) as c:
            with pytest.raises(httpx.ReadTimeout):
                await c.get(f"http://127.0.0.1:{server.port}/")  # the body never comes before the read timeout
    finally:
        server.close()


def test_a_client_that_reaches_any_https_service_keeps_httpcores_own_backend():
    assert rxstamps.backend_for(["http://gpu17:8000", "https://gpu17:9000"]) is None


@needs_stamps
def test_a_client_that_reaches_only_plain_http_services_gets_kernel_stamps():
    assert isinstance(rxstamps.backend_for(["http://gpu17:8000", "http://gpu17:9000"]), rxstamps.StampedBackend)



@needs_stamps
def test_once_stamping_is_held_a_connection_whose_bytes_come_at_once_is_stamped():
    # without a socket holding the kernel's stamping on, about half of these came unstamped here: each
    # closed connection turned it off and each new one on again, in a work item that ran too late
    assert rxstamps.hold_stamping(wait_s=30)
    assert all(rxstamps._stamped_loopback() for _ in range(200))
