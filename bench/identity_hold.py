"""What holding the identity costs a C1 request: the reads after each request with and without the
identity read beside the counter scrape (issue 25), side by side against one host.

The window reads `/metrics` after every C1 request; it now also reads `/flare/v1/identity` in the same
round (concurrently, through the same Target the runner uses). Rounds alternate, so machine noise
falls on both alike. Printed: the median of each round and their ratio, and the identity read's own
median. Against the contract host (tests/contract_host.py: a stdlib HTTP server, one port per service).

Usage: python bench/identity_hold.py [--rounds 400]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flare_diag.daemon.hosts.site import load_site  # noqa: E402
from flare_diag.daemon.hosts.target import Target  # noqa: E402
from tests.contract_tools import ContractHost  # noqa: E402


async def measure(target: Target, rounds: int) -> dict[str, float]:
    scrape_only, with_identity, identity = [], [], []
    for _ in range(3):  # warm the pooled connections
        await asyncio.gather(target.scrape_metrics({}), target.read_identity({}))
    for i in range(rounds):
        t0 = time.perf_counter()
        if i % 2:
            await target.scrape_metrics({})
            scrape_only.append(time.perf_counter() - t0)
        else:
            await asyncio.gather(target.scrape_metrics({}), target.read_identity({}))
            with_identity.append(time.perf_counter() - t0)
            t1 = time.perf_counter()
            await target.read_identity({})
            identity.append(time.perf_counter() - t1)
    a, b, c = (statistics.median(x) * 1000 for x in (scrape_only, with_identity, identity))
    return {"scrape_ms": a, "scrape_and_identity_ms": b, "identity_ms": c, "ratio": b / a}


def run(rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        host = ContractHost(Path(tmp) / "host")
        try:
            target = Target(load_site(host.site), {}, "")

            async def go() -> dict[str, float]:
                try:
                    return await measure(target, rounds)
                finally:
                    await target.close()
            return asyncio.run(go())
        finally:
            host.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=400)
    a = ap.parse_args(argv)
    r = run(a.rounds)
    print(f"reads after a C1 request, median of {a.rounds // 2} rounds each: scrape alone {r['scrape_ms']:.2f} ms, "
          f"scrape and identity {r['scrape_and_identity_ms']:.2f} ms (ratio {r['ratio']:.2f}); "
          f"the identity read alone {r['identity_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
