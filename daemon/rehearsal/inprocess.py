"""An httpx transport that serves an ASGI app in this process and streams each answer as it is sent.

httpx's own `ASGITransport` gathers a response's whole body before it returns, so every event of a
server-sent stream would arrive at its end and a rehearsal's time to first token would be its time to
last. Here each request that may stream runs the app in a task of the transport's task group, and the
response's body is read from the app's `http.response.body` messages as they are sent; closing the
response early (a deadline, a cancelled action) tells the app the client went away and cancels it.

A GET (identity, metrics, the GPU and router views: a host streams only its completions, which are
POSTs) runs the app in the caller's own task and answers with the whole body. The watchers' polls
are most of a rehearsal's requests, and the task, stream and events each would take were 8% of its CPU.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import httpx

ASGIApp = Any


class _Body(httpx.AsyncByteStream):
    def __init__(self, receive: anyio.abc.ObjectReceiveStream, gone: anyio.Event, scope: anyio.CancelScope) -> None:
        self._receive, self._gone, self._scope = receive, gone, scope

    async def __aiter__(self):
        async for msg in self._receive:
            body = msg.get("body", b"")
            if body:
                yield body
            if not msg.get("more_body", False):
                return

    async def aclose(self) -> None:
        self._gone.set()
        self._scope.cancel()
        await self._receive.aclose()


class InProcessTransport(httpx.AsyncBaseTransport):
    """Requests to an ASGI app served by `serve_in_process`; clients may open and close over it freely
    (httpx closes a client's transport with the client), the app's requests end with the block."""

    def __init__(self, app: ASGIApp, tg: anyio.abc.TaskGroup) -> None:
        self.app = app
        self._tg: anyio.abc.TaskGroup | None = tg

    async def aclose(self) -> None:
        """A client's close: the served app goes on serving the other clients."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._tg is None:
            raise httpx.ConnectError("the in-process host is not serving (outside its `serve_in_process` block)", request=request)
        body = b"".join([part async for part in request.stream])  # type: ignore[union-attr]  # an httpx request's stream is async here (an async client)
        url = request.url
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request.method,
            "headers": [(k.lower(), v) for k, v in request.headers.raw], "scheme": url.scheme,
            "path": url.path, "raw_path": url.raw_path.split(b"?")[0], "query_string": url.query,
            "server": (url.host, url.port or 80), "client": ("127.0.0.1", 0), "root_path": "",
        }
        if request.method == "GET":
            return await self._answered_inline(request, scope, body)
        send_msg, receive_msg = anyio.create_memory_object_stream[dict](math.inf)
        gone = anyio.Event()
        started = anyio.Event()
        start: dict = {}
        sent_request = False
        app_scope = anyio.CancelScope()
        failure: list[BaseException] = []

        async def receive() -> dict:
            nonlocal sent_request
            if not sent_request:
                sent_request = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                started.set()
            elif message["type"] == "http.response.body" and not gone.is_set():
                send_msg.send_nowait(message)

        async def serve() -> None:
            with app_scope:
                try:
                    await self.app(scope, receive, send)
                except Exception as exc:  # an app that fails answers 500, as a server would
                    failure.append(exc)
                finally:
                    if not started.is_set():
                        started.set()
                    send_msg.close()

        self._tg.start_soon(serve)
        try:
            await started.wait()
        except BaseException:  # the caller gave up before an answer began (a deadline): the client went away
            gone.set()
            app_scope.cancel()
            raise
        if not start:
            return _failed_before_answering(request, failure[0] if failure else None)
        headers = [(k, v) for k, v in start.get("headers", [])]
        return httpx.Response(start["status"], headers=headers, stream=_Body(receive_msg, gone, app_scope),
                              request=request)

    async def _answered_inline(self, request: httpx.Request, scope: dict, body: bytes) -> httpx.Response:
        """The app run to its end in this task; a deadline or cancellation of the caller cancels it
        where it waits, as the client going away would."""
        start: dict = {}
        chunks: list[bytes] = []
        asked = False

        async def receive() -> dict:
            nonlocal asked
            if not asked:
                asked = True
                return {"type": "http.request", "body": body, "more_body": False}
            await anyio.sleep_forever()  # the client stays until the answer is whole
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        failure: Exception | None = None
        try:
            await self.app(scope, receive, send)
        except Exception as exc:  # an app that fails answers 500, as a server would; after its start, what it sent
            failure = exc
        if not start:
            return _failed_before_answering(request, failure)
        return httpx.Response(start["status"], headers=list(start.get("headers", [])), content=b"".join(chunks),
                              request=request)


def _failed_before_answering(request: httpx.Request, exc: BaseException | None) -> httpx.Response:
    detail = f": {type(exc).__name__}" if exc is not None else ""
    return httpx.Response(500, content=f"in-process app failed before answering{detail}".encode(), request=request)


@asynccontextmanager
async def serve_in_process(app: ASGIApp) -> AsyncIterator[InProcessTransport]:
    """`async with serve_in_process(app) as t:` then `httpx.AsyncClient(transport=t)`. Each request runs
    the app in a task of this block's task group; leaving the block cancels any still running (an
    answer still streaming has no reader left)."""
    async with anyio.create_task_group() as tg:
        transport = InProcessTransport(app, tg)
        try:
            yield transport
        finally:
            transport._tg = None
            tg.cancel_scope.cancel()
