"""The seed's drain rule as a procedure step: gauges at zero and counters unchanged over consecutive scrapes."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from flare_diag.events.answers import MetricsSample, RouterView, read
from flare_diag.events.schema import NS_PER_S, DrainObserved
from flare_diag.policies import rules
from flare_diag.policies.core import WindowCore
from flare_diag.policies.driver import Sleep


def drain(w: WindowCore, timeout_s: float, purpose: str, router: bool = False) -> Generator[Any, Any, bool]:
    """Polls until the drain rule holds or `timeout_s` (floored by WindowCore.drain_timeout_s) runs out."""
    timeout_s = w.drain_timeout_s(timeout_s)
    start = w.now
    polls = [0]
    settled = yield from _drain_polls(w, timeout_s, router, polls)
    w.emit(DrainObserved(purpose=purpose, settled=settled, waited_s=round((w.now - start) / NS_PER_S, 3),
                          polls=polls[0], minute=w.minute()))
    return settled


def _drain_polls(w: WindowCore, timeout_s: float, router: bool, polls: list[int]) -> Generator[Any, Any, bool]:
    timing = w.plan.timing
    start = w.now
    stable, last = 0, None
    while True:
        polls[0] += 1
        calls: list[tuple[str, dict[str, Any]]] = [("scrape_metrics", {})] + ([("snapshot", {"what": "router"})] if router else [])
        res = yield from w.act_all(calls)
        m = res[0]
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
