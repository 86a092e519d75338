"""The event base class, the per-type registry and the payload codec (tagged msgspec unions)."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar, Union

import msgspec

from flare_diag.events.upcast import upcast


class Event(msgspec.Struct, tag_field="type", frozen=True, kw_only=True, forbid_unknown_fields=False, gc=False):
    """Base of every logged event; a subclass's tag is its `type` and is never renamed or reused."""

    schema_v: ClassVar[int] = 1


_REGISTRY: dict[str, type[Event]] = {}


def register(cls: type[Event]) -> type[Event]:
    """Class decorator: adds an event type to the union the log decodes."""
    tag = cls.__struct_config__.tag
    if not isinstance(tag, str):
        raise TypeError(f"{cls.__name__} needs a string tag")
    if tag in _REGISTRY and _REGISTRY[tag] is not cls:
        raise TypeError(f"event tag {tag!r} is already used by {_REGISTRY[tag].__name__}")
    _REGISTRY[tag] = cls
    _codec_cache.clear()
    return cls


def event_type(tag: str) -> type[Event] | None:
    return _REGISTRY.get(tag)


def registered_type(tag: str) -> type[Event]:
    """The type registered under `tag`, which the caller knows is registered (a KeyError otherwise)."""
    return _REGISTRY[tag]


def known_tags() -> dict[str, int]:
    return {tag: cls.schema_v for tag, cls in _REGISTRY.items()}


_codec_cache: dict[str, Any] = {}
_encoder = msgspec.json.Encoder()


def encode_payload(event: Event) -> bytes:
    """The exact bytes that are stored and hashed."""
    return _encoder.encode(event)


def _decoder() -> msgspec.json.Decoder[Event]:
    dec = _codec_cache.get("decoder")
    if dec is None:
        union = Union[tuple(_REGISTRY.values())]  # type: ignore[valid-type]  # a Union built at run time from the registry, as msgspec decodes it
        dec = _codec_cache["decoder"] = msgspec.json.Decoder(union)
    return dec


class UnknownEventError(ValueError):
    """An event whose tag or schema version this build does not know."""


class BadEventError(UnknownEventError):
    """An event whose stored bytes do not decode as its type (a damaged or forged log)."""


def decode_payload(type_: str, schema_v: int, payload: bytes) -> Event:
    """Decodes stored bytes, upcasting older schema versions first."""
    cls = _REGISTRY.get(type_)
    if cls is None:
        raise UnknownEventError(f"unknown event type {type_!r}")
    if schema_v > cls.schema_v:
        raise UnknownEventError(
            f"event type {type_!r} has schema_v {schema_v}, newer than this build's {cls.schema_v}"
        )
    try:
        if schema_v == cls.schema_v:
            ev = _decoder().decode(payload)
        else:
            raw = upcast(type_, schema_v, cls.schema_v, msgspec.json.decode(payload))
            ev = msgspec.convert(raw, cls)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise BadEventError(f"a {type_!r} event whose stored bytes do not decode ({exc})") from None
    if type(ev) is not cls:  # the union decodes by the payload's own tag, which must be the row's
        raise BadEventError(f"a {type_!r} row whose stored bytes are a {ev.__struct_config__.tag!r} event")
    return ev


E = TypeVar("E", bound=Event)


def decode_as(cls: type[E], schema_v: int, payload: bytes) -> E:
    """decode_payload for rows of one type, selected by its tag: the event as that type."""
    ev = decode_payload(str(cls.__struct_config__.tag), schema_v, payload)
    assert isinstance(ev, cls)  # decode_payload returns exactly the tag's registered type
    return ev
