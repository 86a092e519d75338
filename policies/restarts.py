"""Unseen engine restarts: a counter that goes back, or a process start time that moves, within one incarnation.

Contract section 4 (amended 2026-12-03): counters are monotonic within an incarnation. A supervisor
(systemd `Restart=`, a liveness probe) can restart an engine under the same incarnation string, with
its counters and caches back at zero; the only trace it leaves is a counter that decreased, or the
`process_start_time_seconds` gauge an engine exports, which moved. The window names no cause from
what such a restart leaves behind.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec


class RestartWatch(msgspec.Struct, frozen=True):
    """The last counters and start time seen on the incarnation now loaded (empty after a load or unload): a value."""

    counters: dict[str, float] = {}
    start_time: float | None = None
    incarnation: str | None = None  # the incarnation label of the last scrape, where the engine exports one

    def restart_seen(self, counters: Mapping[str, float | None], gauges: Mapping[str, float | None],
                     incarnation: str | None = None) -> str | None:
        """What shows the engine restarted between the last scrape and this one, or None."""
        found = []
        for k, v in sorted(counters.items()):
            was = self.counters.get(k)
            if v is not None and was is not None and v < was:
                found.append(f"{k} went from {was:g} to {v:g}")
        start = gauges.get("process_start_time")
        if start is not None and self.start_time is not None and start != self.start_time:
            found.insert(0, f"process start time moved from {self.start_time:.3f} to {start:.3f}")
        if not found:
            return None
        known = self.incarnation
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        # the words say what the labels show: a supervisor may restart it under the same string or load it anew
        how = (f"as a new incarnation ({known} -> {incarnation})"
               if known is not None and incarnation is not None and known != incarnation else "under the same incarnation")
        return f"the engine restarted unseen {how}: " + "; ".join(found[:3]) + more

    def observed(self, counters: Mapping[str, float | None], gauges: Mapping[str, float | None],
                 incarnation: str | None = None) -> RestartWatch:
        """The watch after this scrape: later ones are held to its counters."""
        start = gauges.get("process_start_time")
        return RestartWatch(counters={k: v for k, v in counters.items() if v is not None},
                            start_time=start if start is not None else self.start_time,
                            incarnation=incarnation if incarnation is not None else self.incarnation)


# a 4xx the host answers when the body itself is refused; 401/403 are the credential's and 429 the
# host's load, each with a meaning of its own
NOT_A_REFUSAL = (401, 403, 429)


def refused(status: int | None) -> bool:
    """A request the host refused for what it is (a schema, a value, a context length)."""
    return status is not None and 400 <= status < 500 and status not in NOT_A_REFUSAL
