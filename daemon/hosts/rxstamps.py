"""The kernel's receive time of a generation's bytes: an httpcore network backend for TCP (and TLS over it)
whose reads ask the kernel when each read's last bytes arrived (SO_TIMESTAMPNS), so a loop busy with other
streams, scrapes or a commit does not move a time to first token."""

from __future__ import annotations

import asyncio
import platform
import select
import socket
import ssl
import struct
import sys
import time
from collections.abc import Iterable
from typing import Any

import anyio
import httpcore

# SO_TIMESTAMPNS (the 64-bit timespec form, "_OLD" in the kernel's headers since 5.1) where the
# kernel's generic socket numbers apply; Python's socket module does not name it. Elsewhere the
# backend is not used and the stamps stay the loop's.
_SO_TIMESTAMPNS = 35
_GENERIC = {"x86_64", "aarch64", "arm64", "riscv64", "s390x", "i686", "i386", "armv7l", "armv8l", "loongarch64"}
_TIMESPEC = struct.Struct("@qq")
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
# A kernel stamp older than this is a clock step, not a slow read: the loop's clock is kept.
_MAX_AGE_NS = 10_000_000_000


def supported() -> bool:
    """Whether this system gives TCP receive timestamps the way this backend asks for them."""
    return sys.platform == "linux" and platform.machine() in _GENERIC and _CMSG_SPACE > 0


class StampedSocketStream(httpcore.AsyncNetworkStream):
    """One TCP connection read with recvmsg; `received_age_ns()` is how long ago (real time) the bytes
    of the latest read reached the kernel, or None where the kernel gave no stamp."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._rx_realtime_ns: int | None = None

    def received_age_ns(self) -> int | None:
        if self._rx_realtime_ns is None:
            return None
        age = time.time_ns() - self._rx_realtime_ns
        return age if 0 <= age < _MAX_AGE_NS else None

    # (the `timeout` parameters are httpcore's network interface, not ours to drop)
    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        try:
            with anyio.fail_after(timeout):
                while True:
                    try:
                        data, ancillary, _flags, _addr = self._sock.recvmsg(max_bytes, _CMSG_SPACE)
                    except (BlockingIOError, InterruptedError):
                        await _readable(self._sock)
                        continue
                    self._rx_realtime_ns = _stamp(ancillary) if data else self._rx_realtime_ns
                    return data
        except TimeoutError:
            raise httpcore.ReadTimeout(f"no bytes in {timeout} s") from None
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from None

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if not buffer:
            return
        try:
            with anyio.fail_after(timeout):
                await asyncio.get_running_loop().sock_sendall(self._sock, buffer)
        except TimeoutError:
            raise httpcore.WriteTimeout(f"could not send in {timeout} s") from None
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from None

    async def aclose(self) -> None:
        self._sock.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:  # noqa: ASYNC109
        tls = StampedTLSStream(self, ssl_context, server_hostname)
        await tls.handshake(timeout)
        return tls

    def get_extra_info(self, info: str) -> Any:
        if info == "socket":
            return self._sock
        if info == "client_addr":
            return self._sock.getsockname()
        if info == "server_addr":
            return self._sock.getpeername()
        if info == "is_readable":
            return _readable_now(self._sock)
        return None


class StampedTLSStream(httpcore.AsyncNetworkStream):
    """TLS over a kernel-stamped connection, decrypted here (an ssl.SSLObject over memory buffers) so that each
    read still knows when its bytes came: a record's plaintext is timed by the receive stamp of the ciphertext
    that completed it, which is when the answer's bytes reached this machine, as for plain TCP."""

    def __init__(self, raw: StampedSocketStream, context: ssl.SSLContext, hostname: str | None) -> None:
        self._raw = raw
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=hostname)

    def received_age_ns(self) -> int | None:
        return self._raw.received_age_ns()

    async def handshake(self, timeout: float | None) -> None:  # noqa: ASYNC109 (httpcore's)
        try:
            with anyio.fail_after(timeout):
                while True:
                    try:
                        self._tls.do_handshake()
                        break
                    except ssl.SSLWantReadError:
                        await self._fill()
                await self._flush()
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"no TLS handshake in {timeout} s") from None
        except (ssl.SSLError, httpcore.ReadError, httpcore.WriteError) as exc:
            raise httpcore.ConnectError(f"TLS handshake: {exc}") from None

    async def _fill(self) -> None:
        """Sends what TLS has to send, then takes the ciphertext that comes next (and its receive stamp)."""
        await self._flush()
        data = await self._raw.read(_TLS_READ)
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()

    async def _flush(self) -> None:
        pending = self._outgoing.read()
        if pending:
            await self._raw.write(pending)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        try:
            with anyio.fail_after(timeout):
                while True:
                    try:
                        data = self._tls.read(max_bytes)
                    except ssl.SSLWantReadError:
                        await self._fill()
                        continue
                    await self._flush()  # what reading left to send (a key update's answer)
                    return data
        except TimeoutError:
            raise httpcore.ReadTimeout(f"no bytes in {timeout} s") from None
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            return b""  # the peer closed (with or without its close_notify: an answer is framed by HTTP)
        except ssl.SSLError as exc:
            raise httpcore.ReadError(f"TLS: {exc}") from None

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if not buffer:
            return
        try:
            self._tls.write(buffer)
        except ssl.SSLError as exc:
            raise httpcore.WriteError(f"TLS: {exc}") from None
        await self._raw.write(self._outgoing.read(), timeout)

    async def aclose(self) -> None:
        await self._raw.aclose()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:  # noqa: ASYNC109
        raise httpcore.ConnectError("TLS inside TLS (an https proxy) is not kernel-stamped")

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._tls
        if info == "is_readable":
            return self._tls.pending() > 0 or self._raw.get_extra_info("is_readable")
        return self._raw.get_extra_info(info)


_TLS_READ = 65536  # ciphertext read a time: a record is at most 16 KiB and its framing


class StampedBackend(httpcore.AsyncNetworkBackend):
    """Plain TCP connections that carry the kernel's receive stamps (`StampedSocketStream`)."""

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,  # noqa: ASYNC109 (httpcore's)
                          local_address: str | None = None,
                          socket_options: Iterable[tuple] | None = None) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            with anyio.fail_after(timeout):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                return StampedSocketStream(await _connect_first(loop, infos, local_address, socket_options or ()))
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"no connection to {host}:{port} in {timeout} s") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from None

    async def connect_unix_socket(self, path: str, timeout: float | None = None,  # noqa: ASYNC109 (httpcore's)
                                  socket_options: Iterable[tuple] | None = None) -> httpcore.AsyncNetworkStream:
        return await httpcore.AnyIOBackend().connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


def backend_for(urls: list[str]) -> httpcore.AsyncNetworkBackend | None:
    """The stamped backend where the kernel gives stamps (http and https alike: TLS is decrypted over it,
    StampedTLSStream); None (httpcore's own) otherwise, or where a URL is neither."""
    global _waited
    if not (supported() and all(u.startswith(("http://", "https://")) for u in urls)):
        return None
    hold_stamping(0.0 if _waited else 0.5)  # a kernel that never stamps loopback costs one wait, not one a client
    _waited = True
    return StampedBackend()


_keeper: socket.socket | None = None
_held = False
_waited = False


def hold_stamping(wait_s: float = 0.5) -> bool:
    """Keeps the kernel stamping received packets for as long as this process lives, and waits (at most
    `wait_s`) until a loopback connection shows that it does; whether it does.

    Linux stamps what it receives only while some socket asks for stamps, and turns that on and off in a
    deferred work item (net_enable_timestamp). A generation's connection is opened per request and closed
    after it, so each one's bytes often came before the stamping was back on: of 200 loopback connections
    made one after another on an idle machine, 119 got no stamp and fell back to the loop's read time; with
    one idle socket asking for stamps all along, none did (docs/performance.md, session 37)."""
    global _keeper, _held
    if _held:
        return True
    if _keeper is None:
        keeper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        keeper.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        _keeper = keeper
    deadline = time.monotonic() + wait_s
    while not (_held := _stamped_loopback()):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def _stamped_loopback() -> bool:
    """Whether one byte over a new loopback TCP connection comes with the kernel's receive stamp."""
    try:
        with socket.create_server(("127.0.0.1", 0)) as listener, socket.socket() as client:
            client.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            client.settimeout(5)
            client.connect(listener.getsockname())
            peer, _ = listener.accept()
            with peer:
                peer.sendall(b"x")
                _data, ancillary, _flags, _addr = client.recvmsg(1, _CMSG_SPACE)
    except OSError:
        return True  # no loopback to ask: nothing to wait for, the stamps are what the kernel gives
    return _stamp(ancillary) is not None


async def _connect_first(loop: asyncio.AbstractEventLoop, infos: list, local_address: str | None,
                         options: Iterable[tuple]) -> socket.socket:
    last: OSError | None = None
    for family, type_, proto, _name, addr in infos:
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            for opt in options:
                sock.setsockopt(*opt)
            if local_address:
                sock.bind((local_address, 0))
            await loop.sock_connect(sock, addr)
            return sock
        except BaseException as exc:
            sock.close()
            if not isinstance(exc, OSError):
                raise
            last = exc
    raise last or OSError(f"no address to connect to ({infos!r})")


def _stamp(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return sec * 1_000_000_000 + nsec
    return None


async def _readable(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)
    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _readable_now(sock: socket.socket) -> bool:
    """httpcore's question of an idle connection: would a read return at once (data, or the peer's close)?"""
    if sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
