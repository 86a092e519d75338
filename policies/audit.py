"""The decision-replay audit: feed a log's recorded inputs to fresh policies and compare decisions."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import msgspec

from flare_diag.events.base import Event
from flare_diag.events.schema import Decision, Input, WindowOpened
from flare_diag.policies.window import WindowPolicy


class Divergence(msgspec.Struct, frozen=True):
    seq: int
    window_id: str
    expected: str
    found: str


class AuditResult(msgspec.Struct, frozen=True):
    ok: bool
    windows: int
    inputs: int
    decisions: int
    divergence: Divergence | None = None


def _show(d: Event | None) -> str:
    return "nothing" if d is None else msgspec.json.encode(d).decode()


def audit(records: Iterable[tuple[int, str, Event]]) -> AuditResult:
    """records: (seq, window_id, event) in seq order. Events that are neither inputs nor decisions are skipped."""
    policies: dict[str, WindowPolicy] = {}
    expected: dict[str, deque[Decision]] = {}
    n_in = n_dec = 0
    last_seq: dict[str, int] = {}
    for seq, wid, ev in records:
        if isinstance(ev, Input):
            q = expected.get(wid)
            if q:
                return AuditResult(False, len(policies), n_in, n_dec,
                                   Divergence(seq, wid, _show(q[0]), f"input {ev.__struct_config__.tag}"))
            if isinstance(ev, WindowOpened) and wid not in policies:
                policies[wid] = WindowPolicy()
            pol = policies.get(wid)
            if pol is None:
                continue
            n_in += 1
            try:
                expected[wid] = deque(pol.receive(ev))
            except Exception as exc:  # the recorded decisions were made without this: a damaged or forged input
                return AuditResult(False, len(policies), n_in, n_dec,
                                   Divergence(seq, wid, "the policy to take this input",
                                              f"it raised {type(exc).__name__}: {exc}"))
            last_seq[wid] = seq
        elif isinstance(ev, Decision):
            n_dec += 1
            q = expected.get(wid)
            want = q.popleft() if q else None
            if want != ev:
                return AuditResult(False, len(policies), n_in, n_dec, Divergence(seq, wid, _show(want), _show(ev)))
    for wid, q in expected.items():
        if q:
            return AuditResult(False, len(policies), n_in, n_dec,
                               Divergence(last_seq[wid] + 1, wid, _show(q[0]), "end of log"))
    return AuditResult(True, len(policies), n_in, n_dec)
