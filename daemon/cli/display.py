"""The terminal streams a foreground window writes to, guarded: the display is never in the safety path."""

from __future__ import annotations

import io
from typing import TextIO


class GuardedStream(io.TextIOBase):
    """A stdout or stderr whose reader may go away (`run ... | head`, a closed ssh session): the first
    write or flush that fails marks it lost, and every later one is dropped. The window it shows goes
    on (or restores, for an interrupt); the command says so at the end and exits 1."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self.lost: BaseException | None = None

    def write(self, s: str) -> int:
        if self.lost is None:
            try:
                self.stream.write(s)
            except (OSError, ValueError) as exc:  # EPIPE, EIO, a closed file
                self.lost = exc
        return len(s)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self.stream.flush()
            except (OSError, ValueError) as exc:
                self.lost = exc

    def isatty(self) -> bool:
        try:
            return self.stream.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]  # a read-only property where TextIO has an attribute
        return getattr(self.stream, "encoding", "utf-8") or "utf-8"
