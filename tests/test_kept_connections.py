"""A kept connection the other side closes as the next request arrives (an idle timeout) never loses an
idempotent read: the steady-state guard's Prometheus queries go out once more on a new connection."""

from __future__ import annotations

import asyncio
import json

from flare_diag.daemon.hosts.prometheus import Prometheus
from flare_diag.daemon.hosts.site import Service, Site, SiteProfile, SteadyState

ANSWER = json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [0, "0.25"]}}).encode()


async def _answer_once_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers a connection's first request and keeps it open; closes it unanswered at the second."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                 + f"content-length: {len(ANSWER)}\r\n\r\n".encode() + ANSWER)
    await writer.drain()
    try:
        await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        pass
    writer.close()


async def test_a_guard_query_on_a_connection_prometheus_closed_is_answered_on_a_new_one():
    server = await asyncio.start_server(_answer_once_per_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    profile = SiteProfile(serving=Service(url="http://127.0.0.1:9"),
                          steady_state=SteadyState(prometheus_url=f"http://127.0.0.1:{port}"))
    prom = Prometheus(Site(profile, {}, "kept", "0" * 64))
    try:
        answers = [await prom.query("up") for _ in range(3)]
    finally:
        await prom.close()
        server.close()
    assert answers == [{"values": [0.25], "series": 1}] * 3
