"""The stored envelope of one event, as read back from the log."""

from __future__ import annotations

import msgspec

from flare_diag.events.base import UnknownEventError, Event, decode_payload


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
        try:
            return decode_payload(self.type, self.schema_v, self.payload)
        except UnknownEventError as exc:
            raise type(exc)(f"seq {self.seq}: {exc}") from None


COLUMNS = "seq, mono_ns, wall_ns, type, schema_v, window_id, causation_seq, payload, prev_hash, hash"
