"""Upcasters: pure functions that lift a stored payload from one schema_v to the next."""

from __future__ import annotations

from typing import Any, Callable

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

_UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def register_upcaster(type_: str, from_v: int) -> Callable[[Upcaster], Upcaster]:
    """Registers the function that turns a (type_, from_v) payload into a from_v + 1 payload."""

    def deco(fn: Upcaster) -> Upcaster:
        key = (type_, from_v)
        if key in _UPCASTERS:
            raise ValueError(f"upcaster for {type_!r} v{from_v} already registered")
        _UPCASTERS[key] = fn
        return fn

    return deco


def upcast(type_: str, from_v: int, to_v: int, raw: dict[str, Any]) -> dict[str, Any]:
    v = from_v
    while v < to_v:
        fn = _UPCASTERS.get((type_, v))
        if fn is None:
            raise ValueError(f"no upcaster from {type_!r} v{v} to v{v + 1}")
        raw = fn(dict(raw))
        v += 1
    return raw
