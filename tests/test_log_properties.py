"""Property tests of the log: any append history keeps the chain valid and seq gapless."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flare_diag.events.reader import LogReader
from flare_diag.events.schema import LogNote
from flare_diag.events.store import EventStore
from flare_diag.events.verify import verify_log

batches = st.lists(
    st.tuples(
        st.lists(st.text(max_size=40), min_size=0, max_size=6),  # one batch's note texts
        st.sampled_from(["", "w1", "w2"]),
        st.booleans(),  # awaited at once, or left in flight
    ),
    min_size=1, max_size=25,
)


async def _apply(path: Path, history, reopen_at: int) -> list[list[str]]:
    store = await EventStore.open(path)
    pending, expected = [], []
    for i, (texts, wid, wait) in enumerate(history):
        if i == reopen_at:
            await asyncio.gather(*pending)
            pending.clear()
            await store.close()
            store = await EventStore.open(path)
        fut = store.submit_many([LogNote(text=t) for t in texts], window_id=wid)
        expected.append(texts)
        if wait:
            await fut
        else:
            pending.append(fut)
    await asyncio.gather(*pending)
    await store.close()
    return expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=batches, reopen_at=st.integers(min_value=0, max_value=30))
def test_random_append_histories_keep_the_chain_valid_and_gapless(history, reopen_at):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "log.db"
        expected = asyncio.run(_apply(path, history, reopen_at))
        with LogReader(path) as r:
            res = verify_log(r)
            texts = [e.event().text for e in r.iter()]
            seqs = [e.seq for e in r.iter()]
    assert res.ok, res.problem
    assert seqs == list(range(1, len(seqs) + 1))
    assert texts == [t for batch in expected for t in batch]
