"""Harness overhead: per-request latency through the runner vs a bare httpx streaming loop.

All sides send the same exact body bytes to the same local flaresim, rotating request by request so
that cache state and machine noise fall on each alike. "Through the runner" is the daemon's own
path: the action task, Target.send_request (httpx-sse, JSON per chunk, timings, bounded copy and
SHA-256 of the answer), the RequestDone input built and appended to the event log. "Bare" is an
httpx stream read line by line until `[DONE]`, twice: on a connection of its own per request, as the
runner sends every generation (one a host closed while idle can never be picked, and nothing is sent
twice), which is the equal-work comparison (goal: ratio <= 1.02 at C4, issue 30), and on a pooled
connection, which shows what that rule costs. Printed: the medians and both ratios, at concurrency 1
and 4. `--rounds 63` at C4 is issue 30's 2,000 requests a side.

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


async def measure(url: str, token: str, rounds: int, concurrency: int, db: Path) -> dict[str, list[float]]:
    plan = decode_plan(PLAN.read_bytes(), str(PLAN))
    fixtures = load_fixtures(plan, [])
    fx = fixtures[FIXTURE]
    store = await EventStore.open(db)
    target = Target(sim_site(url, token), fixtures, "bench")
    runner = Runner(store, target, "bench")
    seq = [0]
    lat: dict[str, list[float]] = {"fresh": [], "pooled": [], "runner": []}
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as fresh, \
            httpx.AsyncClient(timeout=600) as pooled:
        def sides(i: int) -> list[tuple[str, object]]:
            return [("fresh", lambda: bare(fresh, url, token, fx.bodies[i])),
                    ("pooled", lambda: bare(pooled, url, token, fx.bodies[i])),
                    ("runner", lambda: harnessed(runner, fx, i, seq))]

        async def worker(w: int) -> None:
            for r in range(rounds):
                for k in range(len(fx.bodies)):
                    i = (k + w * 2) % len(fx.bodies)
                    order = sides(i)
                    turn = (r + k) % 3  # rotate which side goes first, so that none always meets the warmer cache
                    for name, call in order[turn:] + order[:turn]:
                        lat[name].append(await call())

        for i in range(len(fx.bodies)):  # warm-up: the host cache, the pool and the runner's path
            for _name, call in sides(i):
                await call()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    await target.close()
    await store.close()
    return lat


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
                lat = asyncio.run(measure(url, token, a.rounds, c, Path(d) / f"c{c}.db"))
                m = {k: statistics.median(v) for k, v in lat.items()}
                print(f"C{c}  n={len(lat['runner']):>4}  medians: bare httpx on a connection per request "
                      f"{m['fresh'] * 1e3:7.2f} ms, through the runner {m['runner'] * 1e3:7.2f} ms   ratio runner/bare = "
                      f"{m['runner'] / m['fresh']:.3f} (goal <= 1.02)   [bare on a pooled connection "
                      f"{m['pooled'] * 1e3:7.2f} ms: runner/pooled {m['runner'] / m['pooled']:.3f}]")
    finally:
        proc.terminate()
        proc.wait(5)


if __name__ == "__main__":
    main()
