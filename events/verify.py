"""Chain verification: recompute every hash, find the first bad seq, compare with the checkpoint."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import msgspec

from events.chain import DOMAIN_TAG, GENESIS, _fixed
from events.checkpoint import Checkpoint
from events.reader import LogReader


class VerifyResult(msgspec.Struct, frozen=True):
    ok: bool
    events: int
    head_seq: int
    head_hash: str
    first_bad_seq: int | None = None
    problem: str | None = None


def verify_log(reader: LogReader, checkpoint: Checkpoint | None = None, anchor: Checkpoint | None = None) -> VerifyResult:
    """Walks the chain once; the first divergence (edit, gap, reorder, truncation) is reported by seq.

    `anchor`: a head published outside the log (a window's report, the journal): the log must hold
    that seq with that hash, so a truncated or rewritten log fails even with a checkpoint rewritten
    to match it."""
    if anchor is not None:
        first = verify_log(reader, checkpoint)
        if not first.ok:
            return first
        res = verify_log(reader, anchor)
        if not res.ok and res.problem:
            return msgspec.structs.replace(res, problem=res.problem.replace("checkpoint", "anchor"))
        return res
    sha = hashlib.sha256
    pack = _fixed.pack
    join = b"".join
    prev = GENESIS
    expect = 1
    n = 0
    cp_hash = bytes.fromhex(checkpoint.hash) if checkpoint else None
    cp_seen = False
    prefixes: dict[tuple[str, str], bytes] = {}

    def bad(seq: int, problem: str) -> VerifyResult:
        return VerifyResult(False, n, expect - 1, prev.hex(), seq, problem)

    cur = reader.raw_rows()
    while rows := cur.fetchmany(8192):
        for seq, type_, v, mono, wall, wid, caus, payload, prev_hash, h in rows:
            if seq != expect:
                return bad(expect, f"gap: expected seq {expect}, found {seq} (rows deleted or reordered)")
            if prev_hash != prev:
                return bad(seq, f"seq {seq}: prev_hash does not match the hash of seq {seq - 1} (rows replaced or reordered)")
            try:
                tw = prefixes.get((type_, wid))
                if tw is None:
                    t, w = type_.encode(), wid.encode()
                    tw = prefixes[(type_, wid)] = len(t).to_bytes(2, "big") + t + len(w).to_bytes(2, "big") + w
                calc = sha(join((DOMAIN_TAG, prev, pack(seq, v, mono, wall, -1 if caus is None else caus),
                                 tw, payload))).digest()
            except (TypeError, AttributeError, OverflowError, struct.error):  # a column of the wrong type
                return bad(seq, f"seq {seq}: a column holds a value of the wrong type (row damaged or forged)")
            if calc != h:
                return bad(seq, f"seq {seq}: stored hash does not match its contents (event edited)")
            if cp_hash is not None and seq == checkpoint.seq:  # type: ignore[union-attr]
                cp_seen = True
                if h != cp_hash:
                    return bad(seq, f"seq {seq}: hash differs from the checkpoint's (log rewritten)")
            prev = h
            expect += 1
            n += 1
    if checkpoint is not None and not cp_seen and checkpoint.seq > 0:
        return VerifyResult(False, n, expect - 1, prev.hex(), expect,
                            f"truncated: checkpoint records seq {checkpoint.seq} but the log ends at seq {expect - 1}")
    return VerifyResult(True, n, expect - 1, prev.hex())


def verify_path(db: Path, checkpoint: Checkpoint | None) -> VerifyResult:
    with LogReader(db) as r:
        return verify_log(r, checkpoint)
