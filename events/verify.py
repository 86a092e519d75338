"""Chain verification: recompute every hash, find the first bad seq, compare with the checkpoint."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from pathlib import Path

import msgspec

from flare_diag.events.chain import DOMAIN_TAG, GENESIS, _fixed
from flare_diag.events.checkpoint import Checkpoint
from flare_diag.events.reader import LogReader


def archived_records(payloads: Iterable[bytes]) -> set[tuple[int, str]]:
    """(last_seq, head_hash) of each log_archived payload."""
    out: set[tuple[int, str]] = set()
    for p in payloads:
        d = msgspec.json.decode(p)
        out.add((int(d["last_seq"]), str(d["head_hash"])))
    return out


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
        return _verify_anchored(reader, checkpoint, anchor)
    sha = hashlib.sha256
    pack = _fixed.pack
    join = b"".join
    base = reader.chain_base()
    prev = GENESIS if base is None else base[1]
    expect = 1 if base is None else base[0] + 1
    handed_over: set[tuple[int, str]] = set()  # (last_seq, head_hash) of each log_archived event seen
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
            if type_ == "log_archived":
                handed_over |= archived_records([payload])
            if cp_hash is not None and seq == checkpoint.seq:  # type: ignore[union-attr]  # cp_hash is not None only when a checkpoint was read
                cp_seen = True
                if h != cp_hash:
                    return bad(seq, f"seq {seq}: hash differs from the checkpoint's (log rewritten)")
            prev = h
            expect += 1
            n += 1
    return _ends_as_recorded(VerifyResult(True, n, expect - 1, prev.hex()), base, handed_over, checkpoint, cp_seen)


def _verify_anchored(reader: LogReader, checkpoint: Checkpoint | None, anchor: Checkpoint) -> VerifyResult:
    """The chain against its checkpoint, then against a head published outside the log."""
    first = verify_log(reader, checkpoint)
    if not first.ok:
        return first
    res = verify_log(reader, anchor)
    if not res.ok and res.problem:
        return msgspec.structs.replace(res, problem=res.problem.replace("checkpoint", "anchor"))
    if res.head_seq > anchor.seq:
        # anyone who can write the file can chain an event onto it: the anchor vouches only up to its seq
        return msgspec.structs.replace(res, ok=False, first_bad_seq=anchor.seq + 1, problem=(
            f"seq {anchor.seq + 1} to {res.head_seq} come after the anchored head seq {anchor.seq}: the anchor does "
            f"not cover them (they chain on, as a forger's would); anchor the new head to vouch for them"))
    return res


def _ends_as_recorded(walked: VerifyResult, base: tuple[int, bytes] | None, handed_over: set[tuple[int, str]],
                      checkpoint: Checkpoint | None, cp_seen: bool) -> VerifyResult:
    """A chain walked whole (`walked`), held to where it must begin (an archive's hand-over) and end (its
    checkpoint): the first thing it fails, or itself."""
    n, head, head_hash = walked.events, walked.head_seq, walked.head_hash
    if base is not None and (base[0], base[1].hex()) not in handed_over:
        return VerifyResult(False, n, head, head_hash, base[0] + 1,
                            f"the log starts after seq {base[0]} but no log_archived event in it hands those rows "
                            "over to an archive (rows deleted)")
    if checkpoint is not None and base is not None and checkpoint.seq <= base[0]:
        if checkpoint.seq == base[0] and checkpoint.hash == base[1].hex():
            cp_seen = True  # the checkpoint predates the archive and names its head
        else:
            return VerifyResult(False, n, head, head_hash, head + 1,
                                f"the checkpoint records seq {checkpoint.seq}, which was archived; expected seq "
                                f"{base[0]} or later")
    if checkpoint is not None and not cp_seen and checkpoint.seq > 0:
        return VerifyResult(False, n, head, head_hash, head + 1,
                            f"truncated: checkpoint records seq {checkpoint.seq} but the log ends at seq {head}")
    return walked


def integrity_problems(reader: LogReader, limit: int = 5) -> list[str]:
    """SQLite's own `PRAGMA integrity_check` of the file (b-tree pages, indexes): what it found, or []. A
    damaged index page leaves every row's hash intact, and only this sees it."""
    try:
        rows = [r[0] for r in reader.conn.execute(f"PRAGMA integrity_check({int(limit)})").fetchall()]
    except Exception as exc:  # noqa: BLE001 - a file too damaged to check says so in one line
        return [f"the check itself failed ({' '.join(str(exc).split())[:200]})"]
    return [] if rows == ["ok"] else [" ".join(str(r).split())[:300] for r in rows]


def verify_path(db: Path, checkpoint: Checkpoint | None) -> VerifyResult:
    with LogReader(db) as r:
        return verify_log(r, checkpoint)
