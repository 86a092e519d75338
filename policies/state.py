"""The window's typed state: the cells ledger, the abort, the incumbent and the phase being run."""

from __future__ import annotations

from typing import Any

import msgspec

from flare_diag.events.schema import CellRecorded

# One phase's result (contract section 4) with where it sat on the window's timeline: the ledger
# holds exactly the event that records it.
Cell = CellRecorded


class AbortRecord(msgspec.Struct):
    reason: str
    detail: str
    minute: float | None


class Incumbent(msgspec.Struct):
    """What the manager had loaded when the window started: what the restore brings back."""

    recipe: str | None
    sha256: str | None
    identity: dict[str, Any] = {}


class Running(msgspec.Struct):
    """The phase whose requests are being sent."""

    id: str
    total: int
    comparable: bool
    started_minute: float | None
    estimated_end_minute: float | None
    done: int = 0


class Ledger:
    """The cells decided so far, first decision wins."""

    def __init__(self) -> None:
        self.cells: dict[str, Cell] = {}

    def __contains__(self, phase: str) -> bool:
        return phase in self.cells

    def status(self, phase: str) -> str | None:
        c = self.cells.get(phase)
        return c.status if c else None

    def add(self, cell: Cell) -> bool:
        if cell.phase in self.cells:
            return False
        self.cells[cell.phase] = cell
        return True

    def as_builtins(self) -> dict[str, dict[str, Any]]:
        return {p: msgspec.to_builtins(c) for p, c in self.cells.items()}
