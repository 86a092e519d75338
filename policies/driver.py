"""The procedure driver: generators that yield what they wait for, resumed when an input satisfies it.

A procedure yields `Act` (action outcomes), `Sleep` (a window time) or `Quiet` (no action
outstanding); it may raise `Interrupt` to hand the window to the restore procedure. What it waits for,
the actions it has outstanding and the answers it has not taken yet are the window's state (facts to
`evolve`); the generator, the procedure's continuation, is the one thing held here.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from flare_diag.events.actions import make
from flare_diag.events.schema import ActionRequested, Decision
from flare_diag.policies.evolve import ActionAsked, AnswersTaken, Fact, ProcedureWaits
from flare_diag.policies.state import Act, Asked, Quiet, Sleep, WindowState

Proc = Generator[Any, Any, None]
__all__ = ["Act", "Driver", "Interrupt", "Proc", "Quiet", "Sleep"]


class Interrupt(Exception):
    def __init__(self, cause: str) -> None:
        self.cause = cause


class Driver:
    """Runs one procedure at a time; `on_finish(cause)` is called when it returns or is interrupted."""

    state: WindowState

    def __init__(self) -> None:
        self.gen: Proc | None = None
        self._out: list[Decision] = []

    def apply(self, fact: Fact) -> None:
        raise NotImplementedError  # the window's core: the one way its state changes

    @property
    def now(self) -> int:
        """The window clock: the latest input's time."""
        return self.state.now_ns

    def emit(self, d: Decision) -> None:
        self._out.append(d)

    def _start(self, gen: Proc, on_finish: Callable[[str | None], None]) -> None:
        self.gen = gen
        self._on_finish = on_finish
        self.apply(ProcedureWaits(on=None))
        self._resume(None)

    def _stop(self) -> None:
        if self.gen is not None:
            self.gen.close()
        self.gen = None
        self.apply(ProcedureWaits(on=None))

    def _advance(self) -> None:
        while self.gen is not None:
            w = self.state.waits
            if isinstance(w, Act):
                answered = self.state.answered
                if any(i not in answered for i in w.ids):
                    return
                val: Any = [answered[i] for i in w.ids]
                self.apply(AnswersTaken(ids=w.ids))
            elif isinstance(w, Sleep):
                if self.now < w.until_ns:
                    return
                val = None
            elif isinstance(w, Quiet):
                if self.state.asked:
                    return
                val = None
            else:
                return
            self._resume(val)

    def _resume(self, val: Any) -> None:
        try:
            self.apply(ProcedureWaits(on=self.gen.send(val)))  # type: ignore[union-attr]  # gen is set for as long as the driver runs
        except StopIteration:
            self.gen = None
            self.apply(ProcedureWaits(on=None))
            self._on_finish(None)
        except Interrupt as it:
            self.gen = None
            self.apply(ProcedureWaits(on=None))
            self._on_finish(it.cause)

    def _deadline_s(self, action: str) -> float | None:
        """Window seconds an action may take; a subclass reads them from its plan."""
        return None

    def _reaskable(self, action: str) -> bool:
        """Whether a restart that lost this action's answer may ask it again; a subclass says."""
        return False

    def request(self, action: str, args: dict[str, Any] | None = None, experimental: bool = False,
                for_id: int | None = None) -> int:
        """Asks for an action; its answer goes to the procedure under `for_id` (default: its own id)."""
        request = make(action, args)  # a misspelt action or a missing argument fails here, at once
        aid = self.state.next_action_id
        self.apply(ActionAsked(action_id=aid, asked=Asked(request, experimental, aid if for_id is None else for_id,
                                                          self._reaskable(action))))
        self.emit(ActionRequested(action_id=aid, request=request, experimental=experimental,
                                   deadline_s=self._deadline_s(action)))
        return aid

    def act(self, action: str, args: dict[str, Any] | None = None, experimental: bool = False) -> Generator[Any, Any, Any]:
        aid = self.request(action, args, experimental)
        res = yield Act((aid,))
        return res[0]

    def act_all(self, calls: list[tuple[str, dict[str, Any]]], experimental: bool = False) -> Generator[Any, Any, Any]:
        ids = tuple(self.request(a, args, experimental) for a, args in calls)
        return (yield Act(ids))
