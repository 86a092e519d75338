"""Schema evolution: older payloads are lifted by registered upcasters before decoding."""

from __future__ import annotations

import msgspec
import pytest

from flare_diag.events.base import Event, UnknownEventError, decode_payload, register
from flare_diag.events.upcast import register_upcaster


@register
class _RenamedField(Event, tag="test_renamed_field"):
    schema_v = 2  # type: ignore[misc]
    duration_ms: int


@register_upcaster("test_renamed_field", 1)
def _v1_to_v2(raw):
    raw["duration_ms"] = raw.pop("duration_s") * 1000
    return raw


def test_v1_payload_is_upcast_to_current_type():
    old = msgspec.json.encode({"type": "test_renamed_field", "duration_s": 3})
    ev = decode_payload("test_renamed_field", 1, old)
    assert ev == _RenamedField(duration_ms=3000)


def test_payload_newer_than_the_build_is_refused():
    new = msgspec.json.encode({"type": "test_renamed_field", "duration_ms": 1})
    with pytest.raises(UnknownEventError, match="newer"):
        decode_payload("test_renamed_field", 3, new)


def test_unknown_tag_is_refused():
    with pytest.raises(UnknownEventError, match="unknown event type"):
        decode_payload("no_such_event", 1, b"{}")
