"""The procedure driver: generators that yield what they wait for, resumed when an input satisfies it.

A procedure yields `Act` (action outcomes), `Sleep` (a window time) or `Quiet` (no action
outstanding); it may raise `Interrupt` to hand the window to the restore procedure.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from flare_diag.events.actions import make
from flare_diag.events.answers import Answer, answer_type
from flare_diag.events.schema import ActionRequested, Decision, Input

Proc = Generator[Any, Any, None]


class Act:
    __slots__ = ("ids",)

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class Sleep:
    __slots__ = ("until_ns",)

    def __init__(self, until_ns: int) -> None:
        self.until_ns = until_ns


class Quiet:
    """Wait until no action is outstanding."""


class Interrupt(Exception):
    def __init__(self, cause: str) -> None:
        self.cause = cause


class Driver:
    """Runs one procedure at a time; `on_finish(cause)` is called when it returns or is interrupted."""

    def __init__(self) -> None:
        self.now = 0
        self.next_id = 1
        self.pending: dict[int, tuple[str, bool]] = {}  # id -> (action, experimental)
        self.expects: dict[int, type[Answer] | None] = {}  # id -> the struct its answer decodes into
        self.results: dict[int, Input] = {}
        self.wait: object = None
        self.gen: Proc | None = None
        self._out: list[Decision] = []

    def emit(self, d: Decision) -> None:
        self._out.append(d)

    def _start(self, gen: Proc, on_finish: Callable[[str | None], None]) -> None:
        self.gen = gen
        self._on_finish = on_finish
        self.wait = None
        self._resume(None)

    def _stop(self) -> None:
        if self.gen is not None:
            self.gen.close()
        self.gen = None
        self.wait = None

    def _advance(self) -> None:
        while self.gen is not None:
            w = self.wait
            if isinstance(w, Act):
                if any(i not in self.results for i in w.ids):
                    return
                val: Any = [self.results.pop(i) for i in w.ids]
            elif isinstance(w, Sleep):
                if self.now < w.until_ns:
                    return
                val = None
            elif isinstance(w, Quiet):
                if self.pending:
                    return
                val = None
            else:
                return
            self._resume(val)

    def _resume(self, val: Any) -> None:
        try:
            self.wait = self.gen.send(val)  # type: ignore[union-attr]  # gen is set for as long as the driver runs
        except StopIteration:
            self.gen, self.wait = None, None
            self._on_finish(None)
        except Interrupt as it:
            self.gen, self.wait = None, None
            self._on_finish(it.cause)

    def _deadline_s(self, action: str) -> float | None:
        """Window seconds an action may take; a subclass reads them from its plan."""
        return None

    def request(self, action: str, args: dict[str, Any] | None = None, experimental: bool = False) -> int:
        request = make(action, args)  # a misspelt action or a missing argument fails here, at once
        aid = self.next_id
        self.next_id += 1
        self.pending[aid] = (action, experimental)
        self.expects[aid] = answer_type(request)
        self.emit(ActionRequested(action_id=aid, request=request, experimental=experimental,
                                   deadline_s=self._deadline_s(action)))
        return aid

    def act(self, action: str, args: dict[str, Any] | None = None, experimental: bool = False) -> Generator[Any, Any, Any]:
        aid = self.request(action, args, experimental)
        res = yield Act([aid])
        return res[0]

    def act_all(self, calls: list[tuple[str, dict[str, Any]]], experimental: bool = False) -> Generator[Any, Any, Any]:
        ids = [self.request(a, args, experimental) for a, args in calls]
        return (yield Act(ids))
