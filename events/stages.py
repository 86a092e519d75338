"""Where a window is: the one vocabulary of its stages, shared by the decider, the log's folds and the service."""

from __future__ import annotations

import enum


class Stage(enum.StrEnum):
    """A string enum, so that it reads and compares as the stage's name."""

    IDLE = "idle"              # no window yet
    OPENING = "opening"        # opened: preflight, snapshots and the fixture check, the host not yet taken down
    EXPERIMENT = "experiment"  # from the take-down (t0): the phases run
    RESTORE = "restore"        # on the window's end, an abort or the stop minute: the incumbent comes back
    CLOSED = "closed"


# the stages in which the window's own procedure runs (the restore has not begun)
BEFORE_RESTORE = frozenset({Stage.OPENING, Stage.EXPERIMENT})

# the only moves a window makes: it opens, takes the host down into its experiment, leaves either for the
# restore (on its end, an abort or the stop minute), and closes when the restore ends
TRANSITIONS = {Stage.IDLE: {Stage.OPENING}, Stage.OPENING: {Stage.EXPERIMENT, Stage.RESTORE},
               Stage.EXPERIMENT: {Stage.RESTORE}, Stage.RESTORE: {Stage.CLOSED}, Stage.CLOSED: set()}


class StageError(RuntimeError):
    """A move the table does not allow: a bug in the decider, raised rather than ignored."""


def advance(current: Stage, new: Stage) -> Stage:
    if new not in TRANSITIONS[current]:
        raise StageError(f"a window in {current.value} cannot move to {new.value}")
    return new
