"""Appends events forever from several concurrent appenders, printing each acknowledged seq.

Run as a script by the SIGKILL test: `python -m tests.crash_appender DB`.
"""

from __future__ import annotations

import asyncio
import sys

from flare_diag.events.schema import LogNote
from flare_diag.events.store import EventStore


async def main(path: str) -> None:
    store = await EventStore.open(path)
    out = sys.stdout

    async def appender(k: int) -> None:
        i = 0
        while True:
            if i % 3 == 0:
                envs = await store.append_many([LogNote(text=f"{k}:{i}:{j}") for j in range(4)], window_id=f"w{k}")
            else:
                envs = [await store.append(LogNote(text=f"{k}:{i}"), window_id=f"w{k}")]
            out.write("".join(f"{e.seq}\n" for e in envs))
            out.flush()
            i += 1

    await asyncio.gather(*(appender(k) for k in range(4)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
