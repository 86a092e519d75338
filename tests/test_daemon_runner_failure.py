"""A bug inside a running window (here: the policy raising once) sends the window to restore in-process."""

from __future__ import annotations

import asyncio
import io
import signal
import threading

from flare_diag.daemon.service import control
from flare_diag.daemon.cli.client import Connection
from flare_diag.daemon.service.logs import configure
from flare_diag.daemon.service.notify import Notifier
from flare_diag.daemon.service.server import Service
from tests.daemontools import PLAN, SCALE, Sim
from tests.reviewtools import review_over_socket


async def _until(pred, limit_s: float = 120.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while not pred():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.05)


async def test_a_policy_failure_mid_window_is_picked_up_again_and_restores(tmp_path, monkeypatch):
    import flare_diag.policies.window as pw
    real = pw.WindowPolicy.receive
    raised: list[str] = []

    def receive_that_fails_once(self, inp):
        # the window's own policy, on the daemon's loop (the offline harness rehearses in a worker thread)
        if not raised and type(inp).__name__ == "RequestDone" and threading.current_thread() is threading.main_thread():
            raised.append(inp.phase)
            raise RuntimeError("injected policy failure")
        return real(self, inp)

    monkeypatch.setattr(pw.WindowPolicy, "receive", receive_that_fails_once)
    sim = Sim(tmp_path)
    log = io.StringIO()
    svc = Service(tmp_path / "state", tmp_path / "control.sock", configure(stream=log), Notifier({}), sim.site.parent)
    task = asyncio.create_task(svc.run())
    try:
        await _until(lambda: (tmp_path / "control.sock").exists(), 30)
        await asyncio.to_thread(review_over_socket, PLAN, tmp_path / "control.sock")

        def start() -> dict:
            c = Connection(tmp_path / "control.sock", timeout=600)  # its checks take minutes on a busy machine
            try:
                return c.call(control.Start(plan_toml=PLAN.read_text(), plan_label=str(PLAN), site=sim.site.stem,
                                            time_scale=float(SCALE), accept_partial=True))
            finally:
                c.close()

        wid = (await asyncio.to_thread(start))["window_id"]
        await _until(lambda: svc.window is None and svc.last is not None and svc.last.get("outcome") is not None)
        loaded = sim.get("/manager/v1/state")["loaded"]["recipe"]
    finally:
        svc._on_signal(signal.SIGTERM)
        await asyncio.wait_for(task, 60)
        sim.stop()
    assert raised and svc.last["window_id"] == wid
    assert svc.last["outcome"] == "aborted" and svc.last["abort"]["reason"] == "daemon_restart"
    assert "window runner failed" in log.getvalue() and "injected policy failure" in log.getvalue()
    assert loaded == "glm-incumbent"
