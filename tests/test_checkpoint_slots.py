"""The store's checkpoint file: two slots written in place, read as the newest slot that checks."""

from __future__ import annotations

import hashlib
import os

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from flare_diag.events.checkpoint import SLOT, Checkpoint, CheckpointSlots, read_checkpoint, slot_line
from flare_diag.events.store import EventStore
from flare_diag.events.schema import LogNote


def _h(n: int) -> bytes:
    return hashlib.sha256(str(n).encode()).digest()


def test_each_write_takes_the_other_slot_and_the_reader_takes_the_newest(tmp_path):
    slots = CheckpointSlots(tmp_path / "cp")
    for seq in (1, 2, 3):
        slots.write(seq, _h(seq))
    slots.close()
    assert (tmp_path / "cp").stat().st_size == 2 * SLOT
    cp = read_checkpoint(tmp_path / "cp")
    assert (cp.seq, cp.hash) == (3, _h(3).hex())


@settings(max_examples=200, deadline=None)
@given(writes=st.integers(min_value=2, max_value=6), cut=st.integers(min_value=0, max_value=SLOT))
def test_a_slot_torn_mid_write_reads_as_the_checkpoint_before_never_one_that_never_was(tmp_path_factory, writes, cut):
    path = tmp_path_factory.mktemp("cp") / "cp"
    slots = CheckpointSlots(path)
    for seq in range(1, writes + 1):
        slots.write(seq, _h(seq))
    # the crash: the next write reached the disk only up to `cut` bytes, over the older slot
    data = bytearray(path.read_bytes())
    older = 0 if writes % 2 == 0 else 1
    data[older * SLOT: older * SLOT + cut] = slot_line(writes + 1, _h(writes + 1))[:cut]
    path.write_bytes(bytes(data))
    cp = read_checkpoint(path)
    assert (cp.seq, cp.hash) in {(writes, _h(writes).hex()), (writes + 1, _h(writes + 1).hex())}
    assert cp.seq == writes + 1 or cut < SLOT


def test_a_checkpoint_from_before_the_slots_is_read_and_never_overwritten_by_the_first_slot(tmp_path):
    path = tmp_path / "cp"
    path.write_bytes(msgspec.json.encode(Checkpoint(seq=7, hash=_h(7).hex())) + b"\n")  # an older build's one line
    assert read_checkpoint(path).seq == 7
    slots = CheckpointSlots(path)
    slots.write(8, _h(8))
    assert read_checkpoint(path).seq == 8 and b'"seq":7' in path.read_bytes()  # the old line stands until the next
    slots.write(9, _h(9))
    slots.close()
    assert read_checkpoint(path).seq == 9 and os.path.getsize(path) == 2 * SLOT


def test_a_reopened_store_writes_over_its_older_slot_first(tmp_path):
    path = tmp_path / "cp"
    slots = CheckpointSlots(path)
    for seq in (1, 2, 3):  # slot 0 holds 3, slot 1 holds 2
        slots.write(seq, _h(seq))
    slots.close()
    again = CheckpointSlots(path)
    again.write(4, _h(4))
    again.close()
    data = path.read_bytes()
    assert b'"seq":3' in data[:SLOT] and b'"seq":4' in data[SLOT:]


async def test_the_stores_checkpoint_follows_its_head_commit_by_commit(tmp_path):
    """Each commit's slot is written just after it is answered: at most one commit behind, never two."""
    async with await EventStore.open(tmp_path / "log.db") as store:
        heads = [None]
        for i in range(5):
            await store.append(LogNote(text=f"n{i}"))
            heads.append((store.head[0], store.head[1].hex()))
            cp = read_checkpoint(store.checkpoint_path)
            assert (None if cp is None else (cp.seq, cp.hash)) in heads[-2:]
    cp = read_checkpoint(store.checkpoint_path)
    assert (cp.seq, cp.hash) == heads[-1]


def test_a_new_checkpoint_files_first_slot_arrives_whole_so_a_reader_never_meets_an_empty_file(tmp_path, monkeypatch):
    path = tmp_path / "cp"
    seen: list[int] = []
    real_replace = os.replace

    def watching_replace(src, dst):
        seen.append(path.stat().st_size if path.exists() else -1)  # what a reader would find just before
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", watching_replace)
    slots = CheckpointSlots(path)
    slots.write(1, _h(1))
    slots.write(2, _h(2))
    slots.close()
    assert seen == [-1]  # no file, then a whole slot: never an empty or half-written one
    assert read_checkpoint(path).seq == 2
