"""A generation's times, as `Target.stream_chat` takes them from a real host over loopback: when its bytes
came, however long the daemon then takes to read and parse them."""

from __future__ import annotations

import json
import time

import anyio
import pytest

from flare_diag.daemon.hosts import rxstamps, target as target_module
from flare_diag.daemon.hosts.site import load_site
from flare_diag.daemon.hosts.target import Target
from tests.contract_tools import ContractHost

PARSE_S = 0.2  # what a busy daemon spends on each event before it looks at the next (far above a host's own gaps)


@pytest.mark.skipif(not rxstamps.supported(), reason="the kernel gives no TCP receive stamps here")
def test_a_generations_end_is_when_its_last_bytes_came_not_when_the_daemon_had_read_them(tmp_path, monkeypatch):
    assert rxstamps.hold_stamping(wait_s=30)
    host = ContractHost(tmp_path / "host")
    parsed = []

    def slow_delta_text(delta: dict) -> tuple[str, str]:
        time.sleep(PARSE_S)  # noqa: ASYNC251 (the point: the loop is busy between the bytes' arrival and the end)
        parsed.append(delta)
        return target_module.REAL_DELTA_TEXT(delta)

    monkeypatch.setattr(target_module, "REAL_DELTA_TEXT", target_module.delta_text, raising=False)
    monkeypatch.setattr(target_module, "delta_text", slow_delta_text)
    body = json.dumps({"model": "m", "stream": True, "max_tokens": 16,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()

    async def one() -> dict:
        t = Target(load_site(host.site), {}, "0" * 64)
        try:
            return await t.stream_chat("serving", host.urls["serving"] + "/v1/chat/completions", body)
        finally:
            await t.close()
    try:
        done = anyio.run(one)
    finally:
        host.stop()
    assert len(parsed) >= 4 and done["first_token_stamp"] == "kernel"
    # the host wrote every event at once: the end came with the last token, not a parse of each later
    assert done["end_ns"] - done["last_token_ns"] < PARSE_S * 1e9
    assert done["end_ns"] - done["first_token_ns"] < (len(parsed) - 1) * PARSE_S * 1e9
