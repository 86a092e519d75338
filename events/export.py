"""JSON-lines export of a log: every envelope with its payload decoded (or raw where unknown)."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from flare_diag.events.base import decode_payload
from flare_diag.events.reader import LogReader


def export_lines(reader: LogReader) -> Iterator[bytes]:
    enc = msgspec.json.Encoder()
    for env in reader.iter():
        payload = msgspec.to_builtins(decode_payload(env.type, env.schema_v, env.payload))  # UnknownEventError propagates
        yield enc.encode({
            "seq": env.seq, "mono_ns": env.mono_ns, "wall_ns": env.wall_ns, "type": env.type,
            "schema_v": env.schema_v, "window_id": env.window_id, "causation_seq": env.causation_seq,
            "payload": payload, "prev_hash": env.prev_hash.hex(), "hash": env.hash.hex(),
        })
