"""The hash chain: the exact bytes each event's SHA-256 covers, and the genesis value."""

from __future__ import annotations

import hashlib
import struct

DOMAIN_TAG = b"flare-diag.event-chain/1\x00"
GENESIS = bytes(32)
_fixed = struct.Struct(">QIqqq")


def event_hash(
    prev_hash: bytes,
    seq: int,
    type_: str,
    schema_v: int,
    mono_ns: int,
    wall_ns: int,
    window_id: str,
    causation_seq: int | None,
    payload: bytes,
) -> bytes:
    """SHA-256 over the domain tag, the previous hash, every envelope field and the payload bytes.

    Variable-length fields are length-prefixed so that no two envelopes share a preimage.
    window_id and causation_seq are covered too (an extension of design.md: they must not be
    editable without breaking the chain).
    """
    t = type_.encode()
    w = window_id.encode()
    return hashlib.sha256(
        b"".join(
            (
                DOMAIN_TAG,
                prev_hash,
                _fixed.pack(seq, schema_v, mono_ns, wall_ns, -1 if causation_seq is None else causation_seq),
                len(t).to_bytes(2, "big"),
                t,
                len(w).to_bytes(2, "big"),
                w,
                payload,
            )
        )
    ).digest()
