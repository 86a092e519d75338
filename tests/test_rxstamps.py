"""The kernel's receive stamps on a generation's connection (daemon/hosts/rxstamps.py): a chunk's time is
when its bytes reached this machine, however late a busy loop reads them."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import httpcore
import httpx
import pytest

from flare_diag.daemon.hosts import rxstamps
from flare_diag.daemon.hosts.stamping import StampingTransport, read_ns, read_source, stamped_transport

needs_stamps = pytest.mark.skipif(not rxstamps.supported(), reason="the kernel gives no TCP receive stamps here")


class _SlowBody:
    """A one-connection HTTP server on its own thread: headers at once, the body when `release` is set;
    `sent` is set once the body's bytes are handed to the kernel."""

    def __init__(self, certificate: tuple[Path, Path] | None = None) -> None:
        self.tls: ssl.SSLContext | None = None
        if certificate is not None:  # https: the same answer inside TLS
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls.load_cert_chain(*certificate)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.release, self.sent = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError):  # a client that refused the certificate
                conn.close()
                return
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


@needs_stamps
def test_a_client_that_reaches_https_services_gets_kernel_stamps_too():
    assert isinstance(rxstamps.backend_for(["http://gpu17:8000", "https://gpu17:9000"]), rxstamps.StampedBackend)


def test_a_client_that_reaches_a_url_of_another_scheme_keeps_httpcores_own_backend():
    assert rxstamps.backend_for(["http://gpu17:8000", "unix:///run/engine.sock"]) is None


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made by openssl for the test."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def _tls_transport(cafile: Path | None) -> StampingTransport:
    """A generation's transport over the stamped backend, trusting `cafile` (None: the default trust)."""
    ctx = ssl.create_default_context(cafile=str(cafile)) if cafile else ssl.create_default_context()
    inner = httpx.AsyncHTTPTransport(verify=ctx)
    inner._pool = httpcore.AsyncConnectionPool(ssl_context=ctx, max_keepalive_connections=0,
                                               network_backend=rxstamps.StampedBackend())
    return StampingTransport(inner, time.monotonic_ns)


@needs_stamps
@pytest.mark.asyncio
async def test_over_https_a_chunk_read_late_by_a_blocked_loop_keeps_the_time_its_bytes_arrived(certificate):
    assert rxstamps.hold_stamping(wait_s=30)
    server = _SlowBody(certificate)
    try:
        async with httpx.AsyncClient(transport=_tls_transport(certificate[0])) as c:
            async with c.stream("GET", f"https://127.0.0.1:{server.port}/") as r:
                server.release.set()
                assert server.sent.wait(30)
                arrived_by = time.monotonic_ns()
                time.sleep(0.3)  # noqa: ASYNC251 (the point: the loop is busy, as with another stream, a scrape, a commit)
                assert await r.aread() == b"data: {}\n\n"
                assert read_ns(r, time.monotonic_ns) <= arrived_by and read_source(r) == "kernel"
    finally:
        server.close()


@needs_stamps
@pytest.mark.asyncio
async def test_over_https_a_certificate_the_client_does_not_trust_is_httpx_connect_error(certificate):
    server = _SlowBody(certificate)
    try:
        async with httpx.AsyncClient(transport=_tls_transport(None)) as c:
            with pytest.raises(httpx.ConnectError, match="TLS handshake"):
                await c.get(f"https://127.0.0.1:{server.port}/")
    finally:
        server.close()


@needs_stamps
def test_a_client_that_reaches_only_plain_http_services_gets_kernel_stamps():
    assert isinstance(rxstamps.backend_for(["http://gpu17:8000", "http://gpu17:9000"]), rxstamps.StampedBackend)



@needs_stamps
def test_once_stamping_is_held_a_connection_whose_bytes_come_at_once_is_stamped():
    # without a socket holding the kernel's stamping on, about half of these came unstamped here: each
    # closed connection turned it off and each new one on again, in a work item that ran too late
    assert rxstamps.hold_stamping(wait_s=30)
    assert all(rxstamps._stamped_loopback() for _ in range(200))
