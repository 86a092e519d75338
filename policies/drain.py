"""The seed's drain rule as a procedure step: gauges at zero and counters unchanged over consecutive scrapes."""

from __future__ import annotations

from collections.abc import Collection, Generator, Mapping
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
    held: str = ""  # what held the last answered scrape from the rule (Drained.held_words); "" when none answered

    def unanswered_words(self) -> str:
        """' (2 of 3 scrapes got no answer: ...)' when some did, for the words of a drain that did not settle."""
        return f" ({self.unanswered} of {self.polls} scrapes got no answer: {self.last_error})" if self.unanswered else ""


def held_words(gauges: Mapping[str, float | None], changed: list[str], accept_unobserved: Collection[str],
               routed_inflight: int | None = None) -> str:
    """What kept one answered scrape from the drain rule, as it was seen: the busy gauges
    ('requests_pending = 100'), the gauges it did not carry, the router's count in flight, or the counters
    that moved since the scrape before it. "" when it met the rule."""
    if busy := {g: v for g in rules.DRAIN_GAUGES if (v := gauges.get(g))}:
        return ", ".join(f"{g} = {v:g}" for g, v in busy.items())
    if unseen := [g for g in rules.unseen_drain_gauges(gauges) if g not in accept_unobserved]:
        return f"its metrics do not carry {', '.join(unseen)}"
    if routed_inflight:
        return f"the router counts {routed_inflight} in flight to it"
    if changed:
        return f"every drain gauge at zero, but {', '.join(changed)} still changed between scrapes"
    return ""


def drain(w: WindowCore, timeout_s: float, purpose: str, router: bool = False) -> Generator[Any, Any, Drained]:
    """Polls until the drain rule holds or `timeout_s` (floored by WindowCore.drain_timeout_s) runs out."""
    timeout_s = w.drain_timeout_s(timeout_s)
    start = w.now
    seen: list[Any] = []  # each poll's metrics answer
    held: list[str] = []  # each answered poll's held_words
    settled = yield from _drain_polls(w, timeout_s, router, seen, held)
    w.emit(DrainObserved(purpose=purpose, settled=settled, waited_s=round((w.now - start) / NS_PER_S, 3),
                          polls=len(seen), minute=w.minute()))
    failed = [m for m in seen if not m.ok]
    return Drained(settled, len(seen), len(failed), (failed[-1].detail or failed[-1].error or "") if failed else "",
                   held[-1] if held else "")


def _drain_polls(w: WindowCore, timeout_s: float, router: bool, seen: list[Any],
                 held: list[str]) -> Generator[Any, Any, bool]:
    timing = w.plan.timing
    start = w.now
    stable, last = 0, None
    before: Mapping[str, float | None] | None = None  # the last answered scrape's counters
    while True:
        calls: list[tuple[str, dict[str, Any]]] = [("scrape_metrics", {})] + ([("snapshot", {"what": "router"})] if router else [])
        res = yield from w.act_all(calls)
        m = res[0]
        seen.append(m)
        sample = read(MetricsSample, m) if m.ok else MetricsSample()
        ok = m.ok and rules.drained(sample.gauges, w.plan.drain.accept_unobserved)
        inflight = read(RouterView, res[1]).backend.inflight if router and len(res) > 1 and res[1].ok else None
        ok = ok and not inflight
        if m.ok:
            w.drain_gauges_unseen(rules.unseen_drain_gauges(sample.gauges))
            changed = [c for c, v in sample.counters.items() if before is not None and before.get(c) != v]
            held.append(held_words(sample.gauges, changed, w.plan.drain.accept_unobserved, inflight))
            before = sample.counters
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
