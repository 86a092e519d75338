"""The seed's drain rule as a procedure step: gauges at zero and counters unchanged over consecutive scrapes."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import msgspec

from flare_diag.events.answers import MetricsSample, RouterView, read
from flare_diag.events.schema import NS_PER_S, DrainObserved
from flare_diag.policies import rules
from flare_diag.policies.core import WindowCore
from flare_diag.policies.driver import Sleep


class Drained(msgspec.Struct, frozen=True):
    """How a drain ended: settled or not, and the scrapes that got no answer (whose silence is not a busy engine)."""

    settled: bool
    polls: int = 0
    unanswered: int = 0
    last_error: str = ""  # the last unanswered scrape's words

    def unanswered_words(self) -> str:
        """' (2 of 3 scrapes got no answer: ...)' when some did, for the words of a drain that did not settle."""
        return f" ({self.unanswered} of {self.polls} scrapes got no answer: {self.last_error})" if self.unanswered else ""


def drain(w: WindowCore, timeout_s: float, purpose: str, router: bool = False) -> Generator[Any, Any, Drained]:
    """Polls until the drain rule holds or `timeout_s` (floored by WindowCore.drain_timeout_s) runs out."""
    timeout_s = w.drain_timeout_s(timeout_s)
    start = w.now
    seen: list[Any] = []  # each poll's metrics answer
    settled = yield from _drain_polls(w, timeout_s, router, seen)
    w.emit(DrainObserved(purpose=purpose, settled=settled, waited_s=round((w.now - start) / NS_PER_S, 3),
                          polls=len(seen), minute=w.minute()))
    failed = [m for m in seen if not m.ok]
    return Drained(settled, len(seen), len(failed), (failed[-1].detail or failed[-1].error or "") if failed else "")


def _drain_polls(w: WindowCore, timeout_s: float, router: bool, seen: list[Any]) -> Generator[Any, Any, bool]:
    timing = w.plan.timing
    start = w.now
    stable, last = 0, None
    while True:
        calls: list[tuple[str, dict[str, Any]]] = [("scrape_metrics", {})] + ([("snapshot", {"what": "router"})] if router else [])
        res = yield from w.act_all(calls)
        m = res[0]
        seen.append(m)
        sample = read(MetricsSample, m) if m.ok else MetricsSample()
        ok = m.ok and rules.drained(sample.gauges, w.plan.drain.accept_unobserved)
        if m.ok:
            w.drain_gauges_unseen(rules.unseen_drain_gauges(sample.gauges))
        if router and len(res) > 1 and res[1].ok:
            ok = ok and not read(RouterView, res[1]).backend.inflight
        if ok:
            counters = sample.counters
            stable = stable + 1 if last is not None and counters == last else 1
            last = counters
            if stable >= timing.stable_observations:
                w.counters_drained(counters)
                return True
        else:
            stable, last = 0, None
        if w.now - start >= int(timeout_s * NS_PER_S):
            return False
        yield Sleep(w.now + int(timing.drain_poll_s * NS_PER_S))
