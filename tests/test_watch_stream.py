"""The watch stream's end: a window that closes while a watcher is being caught up is never cut short."""

from __future__ import annotations

import json
import types

from flare_diag.daemon.service import control
from flare_diag.daemon.service.notify import Notifier
from flare_diag.daemon.service.server import Service
from flare_diag.events.schema import OperatorAbort, WindowClosed
from flare_diag.events.store import EventStore


class _Quiet:
    def __getattr__(self, name):
        return lambda *a, **k: None


async def test_a_window_that_closes_while_its_backlog_is_sent_still_streams_its_close_before_saying_none_runs(tmp_path):
    svc = Service(tmp_path, tmp_path / "control.sock", log=_Quiet(), notifier=Notifier({}))
    svc.store = await EventStore.open(svc.db)
    try:
        await svc.store.append(OperatorAbort(at_ns=1, reason="operator test"), window_id="w1")
        svc.window = types.SimpleNamespace(window_id="w1")
        sent: list[bytes] = []

        async def send(conn, data: bytes) -> None:
            sent.append(data)
            if len(sent) == 1:  # the window closes while the backlog is on its way (a clean-clone CI run saw it)
                await svc.store.append(WindowClosed(outcome="aborted", minute=0.5), window_id="w1")
                await svc.store.flush()
                svc.last, svc.window = {"window_id": "w1", "outcome": "aborted"}, None

        svc._send = send  # type: ignore[method-assign]
        await svc._watch(control.Watch(from_seq=1), conn=None)  # type: ignore[arg-type]
    finally:
        await svc.store.close()
    lines = [json.loads(line) for chunk in sent for line in chunk.splitlines()]
    assert [x.get("type") or ("none running" if x.get("watching") is False else "header") for x in lines] == [
        "header", "operator_abort", "window_closed", "none running"]
