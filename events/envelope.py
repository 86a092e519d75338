"""The stored envelope of one event, as read back from the log."""

from __future__ import annotations

import msgspec

from flare_diag.events.base import Event, UnknownEventError, decode_payload


class Envelope(msgspec.Struct, frozen=True, gc=False):
    """One row of the log: gapless seq, both clocks, the tag, and the payload bytes exactly as hashed."""

    seq: int
    mono_ns: int
    wall_ns: int
    type: str
    schema_v: int
    window_id: str
    causation_seq: int | None
    payload: bytes
    prev_hash: bytes
    hash: bytes

    def event(self) -> Event:
        return _event(self.seq, self.type, self.schema_v, self.payload)


class ReadEvent(msgspec.Struct, frozen=True, gc=False):
    """One row of the log as a projection reads it: the envelope's fields a fold uses, without the
    clock, causation and hashes it does not (each column read costs the reader a little)."""

    seq: int
    wall_ns: int
    type: str
    schema_v: int
    window_id: str
    payload: bytes

    def event(self) -> Event:
        return _event(self.seq, self.type, self.schema_v, self.payload)


def _event(seq: int, type_: str, schema_v: int, payload: bytes) -> Event:
    try:
        return decode_payload(type_, schema_v, payload)
    except UnknownEventError as exc:
        raise type(exc)(f"seq {seq}: {exc}") from None


COLUMNS = "seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload, prev_hash, hash"
