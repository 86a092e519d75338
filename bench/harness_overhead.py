"""Harness overhead: per-request latency through the runner vs a bare httpx streaming loop.

Both send the same exact body bytes to the same local flaresim, alternating request by request so
that cache state and machine noise fall on both alike. "Through the runner" is the daemon's own
path: the action task, Target.send_request (httpx-sse, JSON per chunk, timings, bounded copy and
SHA-256 of the answer), the RequestDone input built and appended to the event log. "Bare" is an
httpx stream read line by line until `[DONE]`. Printed: median latency of each and their ratio, at
concurrency 1 and 4 (goal: ratio <= 1.05).

Usage: python bench/harness_overhead.py [--rounds 6] [--time-scale 20]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flare_diag.daemon.rehearsal.rehearse import start_sim  # noqa: E402
from flare_diag.daemon.window.runner import Runner  # noqa: E402
from flare_diag.daemon.hosts.site import sim_site  # noqa: E402
from flare_diag.daemon.hosts.target import Target  # noqa: E402
from flare_diag.daemon.window.setup import load_fixtures  # noqa: E402
from flare_diag.events.actions import SendRequest  # noqa: E402
from flare_diag.events.schema import ActionRequested  # noqa: E402
from flare_diag.events.store import EventStore  # noqa: E402
from flare_diag.policies.plan import decode_plan  # noqa: E402

FIXTURE = "tok1024"
PLAN = Path(__file__).resolve().parent.parent / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"


async def bare(client: httpx.AsyncClient, url: str, token: str, body: bytes) -> float:
    t0 = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/chat/completions", content=body,
                             headers={"Authorization": f"Bearer {token}", "content-type": "application/json"}) as r:
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                break
    return time.perf_counter() - t0


async def harnessed(runner: Runner, fixture, i: int, seq: list[int]) -> float:
    seq[0] += 1
    d = ActionRequested(action_id=seq[0], experimental=True,
                        request=SendRequest(phase="bench", order_index=seq[0], body_index=i, fixture=FIXTURE,
                                            body_sha256=fixture.sha256[i]))
    t0 = time.perf_counter()
    await runner._execute(d, anyio.CancelScope())  # the action task: request, timings, classification
    await runner.feed(runner._receive.receive_nowait())  # its outcome appended to the log as an input
    return time.perf_counter() - t0


async def measure(url: str, token: str, rounds: int, concurrency: int, db: Path) -> tuple[list[float], list[float]]:
    plan = decode_plan(PLAN.read_bytes(), str(PLAN))
    fixtures = load_fixtures(plan, [])
    fx = fixtures[FIXTURE]
    store = await EventStore.open(db)
    target = Target(sim_site(url, token), fixtures, "bench")
    runner = Runner(store, target, "bench")
    seq = [0]
    b_lat: list[float] = []
    h_lat: list[float] = []
    async with httpx.AsyncClient(timeout=600) as client:
        async def worker(w: int) -> None:
            for r in range(rounds):
                for k in range(len(fx.bodies)):
                    i = (k + w * 2) % len(fx.bodies)
                    # alternate which path goes first so that neither always meets the warmer cache
                    if (r + k) % 2:
                        b_lat.append(await bare(client, url, token, fx.bodies[i]))
                        h_lat.append(await harnessed(runner, fx, i, seq))
                    else:
                        h_lat.append(await harnessed(runner, fx, i, seq))
                        b_lat.append(await bare(client, url, token, fx.bodies[i]))

        for i in range(len(fx.bodies)):  # warm-up: the host cache and both connection pools
            await bare(client, url, token, fx.bodies[i])
            await harnessed(runner, fx, i, seq)
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    await target.close()
    await store.close()
    return b_lat, h_lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--time-scale", type=float, default=20.0)
    a = ap.parse_args()
    token = secrets.token_hex(16)
    proc, url = start_sim("flare-47581cca", a.time_scale, token)
    try:
        with tempfile.TemporaryDirectory() as d:
            for c in (1, 4):
                b, h = asyncio.run(measure(url, token, a.rounds, c, Path(d) / f"c{c}.db"))
                mb, mh = statistics.median(b), statistics.median(h)
                print(f"C{c}  n={len(b):>4}  bare httpx median {mb * 1e3:8.2f} ms   through the runner median "
                      f"{mh * 1e3:8.2f} ms   ratio runner/bare = {mh / mb:.3f}  (goal <= 1.05)")
    finally:
        proc.terminate()
        proc.wait(5)


if __name__ == "__main__":
    main()
