"""The in-process host transport a rehearsal talks to flaresim through: streamed answers arrive as they
are sent, a GET is answered whole in the caller's task, and a caller's deadline cancels the app."""

from __future__ import annotations

import anyio
import httpx
import pytest

from flare_diag.daemon.rehearsal.inprocess import serve_in_process


async def _answer(send, status: int = 200, parts: tuple[bytes, ...] = (b"whole",)) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"x-host", b"in-process")]})
    for i, part in enumerate(parts):
        await send({"type": "http.response.body", "body": part, "more_body": i < len(parts) - 1})


async def test_a_streamed_answer_arrives_part_by_part_before_the_app_sends_the_rest():
    read_first = anyio.Event()

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await read_first.wait()  # the rest only once the client has read the first event
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": False})

    async with serve_in_process(app) as t, httpx.AsyncClient(transport=t) as c:
        async with c.stream("POST", "http://host/v1/chat/completions", json={"stream": True}) as r:
            parts = []
            async for part in r.aiter_raw():
                parts.append(part)
                read_first.set()
    assert parts == [b"data: 1\n\n", b"data: 2\n\n"]


async def test_a_get_is_answered_whole_with_the_apps_status_headers_and_body():
    seen = {}

    async def app(scope, receive, send):
        seen.update(method=scope["method"], path=scope["path"], query=scope["query_string"])
        await _answer(send, 203, (b'{"a": ', b"1}"))

    async with serve_in_process(app) as t, httpx.AsyncClient(transport=t) as c:
        r = await c.get("http://host/flare/v1/identity?x=1")
    assert (r.status_code, r.headers["x-host"], r.json()) == (203, "in-process", {"a": 1})
    assert seen == {"method": "GET", "path": "/flare/v1/identity", "query": b"x=1"}


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_an_app_that_fails_before_answering_answers_500_naming_the_error(method):
    async def app(scope, receive, send):
        raise KeyError("boom")

    async with serve_in_process(app) as t, httpx.AsyncClient(transport=t) as c:
        r = await c.request(method, "http://host/metrics")
    assert r.status_code == 500 and "KeyError" in r.text


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_request_whose_app_never_answers_is_cancelled_by_the_callers_deadline(method):
    cancelled = anyio.Event()

    async def app(scope, receive, send):
        try:
            await anyio.sleep_forever()  # a hung scrape or router
        finally:
            cancelled.set()

    async with serve_in_process(app) as t, httpx.AsyncClient(transport=t) as c:
        with anyio.move_on_after(0.05) as scope:
            await c.request(method, "http://host/metrics")
        with anyio.fail_after(60):  # seconds only a broken transport would need
            await cancelled.wait()
    assert scope.cancelled_caught
