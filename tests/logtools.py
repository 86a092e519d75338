"""Helpers for tests that need a log on disk or need to tamper with one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from flare_diag.events.schema import LogNote
from flare_diag.events.store import EventStore


async def write_notes(path: Path, n: int, window_id: str = "w1") -> EventStore:
    store = await EventStore.open(path)
    await store.append_many([LogNote(text=f"note {i}") for i in range(n)], window_id=window_id)
    return store


def tamper(path: Path, *statements: str) -> None:
    """Drops the append-only triggers (as an attacker with file access would) and runs SQL."""
    conn = sqlite3.connect(path)
    for trig in ("events_no_update", "events_no_delete"):
        conn.execute(f"DROP TRIGGER IF EXISTS {trig}")
    for s in statements:
        conn.execute(s)
    conn.commit()
    conn.close()


async def write_window(path: Path, window_id: str = "w-report", hook=None, clock=None, opened=None, **world_kw) -> None:
    """A whole window driven by the in-memory World, every input and decision appended as the runner
    does (`clock`: the store's (mono_ns, wall_ns) clock, to date the window; `opened` changes its
    window_opened, as drive's does)."""
    from flare_diag.policies.window import WindowPolicy
    from tests.policy_world import World, drive, plan_builtins

    plan = world_kw.pop("plan", None) or plan_builtins()
    history = drive(WindowPolicy(), World(plan, **world_kw), hook=hook, window_id=window_id, opened=opened)
    async with await (EventStore.open(path) if clock is None else EventStore.open(path, clock=clock)) as store:
        for inp, ds in history:
            store.submit_many([inp, *ds], window_id=window_id)
        await store.flush()


def forge(path: Path, mutate) -> tuple[int, bytes]:
    """What a forger with write access to the state folder can do: rewrite rows (`mutate(row dict)`
    returns it changed), recompute the whole chain, and write a matching, unsigned checkpoint.
    Returns the new head (seq, hash)."""
    from flare_diag.events.chain import GENESIS, event_hash
    from flare_diag.events.checkpoint import default_path, write_checkpoint
    conn = sqlite3.connect(path)
    cols = ["seq", "mono_ns", "wall_ns", "type", "schema_v", "window_id", "causation_seq", "payload"]
    rows = [dict(zip(cols, r)) for r in conn.execute(f"SELECT {', '.join(cols)} FROM events ORDER BY seq")]
    for trig in ("events_no_update", "events_no_delete"):
        conn.execute(f"DROP TRIGGER IF EXISTS {trig}")
    conn.execute("DELETE FROM events")
    prev = GENESIS
    for r in rows:
        r = mutate(dict(r))
        h = event_hash(prev, r["seq"], r["type"], r["schema_v"], r["mono_ns"], r["wall_ns"], r["window_id"],
                       r["causation_seq"], bytes(r["payload"]))
        conn.execute("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?)",
                     (r["seq"], r["mono_ns"], r["wall_ns"], r["type"], r["schema_v"], r["window_id"], r["causation_seq"],
                      bytes(r["payload"]), prev, h))
        prev = h
    conn.commit()
    conn.close()
    write_checkpoint(default_path(path), rows[-1]["seq"], prev)
    return rows[-1]["seq"], prev
