"""systemd's notify protocol (READY, STATUS, WATCHDOG, STOPPING) over $NOTIFY_SOCKET; silent without it."""

from __future__ import annotations

import os
from collections.abc import Mapping
import socket
import time

# A window commits many times a second and each commit may change the status line; systemd only
# needs to show a current one. Status updates closer together than this are skipped (forced ones
# and changes of READY/STOPPING are not).
STATUS_MIN_INTERVAL_S = 1.0


class Notifier:
    """Sends sd_notify datagrams. Outside systemd (no NOTIFY_SOCKET) every call is a no-op."""

    def __init__(self, given: Mapping[str, str] | None = None) -> None:
        env = os.environ if given is None else given
        addr = env.get("NOTIFY_SOCKET", "")
        if addr.startswith("@"):  # abstract namespace
            addr = "\0" + addr[1:]
        self._addr = addr or None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        # systemd asks for a ping at least every WATCHDOG_USEC; ping at half of it.
        self.watchdog_interval_s = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and mine else None
        self._status: str | None = None
        self._status_at = float("-inf")

    @property
    def enabled(self) -> bool:
        return self._addr is not None

    def send(self, **fields: str) -> None:
        if self._addr is None:
            return
        msg = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        if "status" in fields:
            self._status, self._status_at = fields["status"], time.monotonic()
        # Non-blocking: a notify socket whose queue is full (its reader busy) must never stall the
        # event loop that runs a window; a lost notification must never take the service down.
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as s:
            try:
                s.sendto(msg, self._addr)
            except OSError:
                pass

    def ready(self, status: str) -> None:
        self.send(ready="1", status=status)

    def status(self, status: str, force: bool = False) -> None:
        """A new status line; skipped when unchanged, or (unless forced) too soon after the last."""
        if status == self._status or (not force and time.monotonic() - self._status_at < STATUS_MIN_INTERVAL_S):
            return
        self.send(status=status)

    def watchdog(self) -> None:
        self.send(watchdog="1")

    def stopping(self, status: str) -> None:
        self.send(stopping="1", status=status)
