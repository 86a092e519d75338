"""Folding the log into projections: the one way reports and recovery read history."""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterable
from typing import TypeVar

from flare_diag.events.envelope import Envelope

S = TypeVar("S")


def fold(envelopes: Iterable[Envelope], init: S, step: Callable[[S, Envelope], S]) -> S:
    state = init
    for env in envelopes:
        state = step(state, env)
    return state


async def afold(envelopes: AsyncIterable[Envelope], init: S, step: Callable[[S, Envelope], S]) -> S:
    state = init
    async for env in envelopes:
        state = step(state, env)
    return state
