"""The decision-replay audit: feed a log's recorded inputs to fresh policies and compare decisions."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import msgspec

from flare_diag.events.base import Event
from flare_diag.events.schema import Decision, Input, WindowOpened
from flare_diag.policies.window import WindowPolicy

SHOWN = 72  # characters of a differing value shown around its first difference: a divergence is one line


class Divergence(msgspec.Struct, frozen=True):
    seq: int
    window_id: str
    expected: str  # the decision the replayed policy made there (only the fields that differ), or what it wanted
    found: str     # what the log holds there, the same fields


class NotReplayed(msgspec.Struct, frozen=True):
    """A window decided by another version of the policy, which this build decides differently: its
    decisions are neither confirmed nor refuted here; the flare-diag that made them can audit them."""
    window_id: str
    policy_sha256: str  # as window_opened recorded it ("" in a log older than the field)
    at: Divergence      # where this build's decisions first part from the recorded ones


class AuditResult(msgspec.Struct, frozen=True):
    ok: bool  # every decision of every window replayed equal
    windows: int
    inputs: int
    decisions: int
    divergence: Divergence | None = None   # the first decision that differs under the policy that made it
    not_replayed: tuple[NotReplayed, ...] = ()


def _value(v: object) -> str:
    return msgspec.json.encode(v).decode()


def _clip(text: str, at: int) -> str:
    """text around position `at` (its first difference from the other side), SHOWN characters at most."""
    if len(text) <= SHOWN:
        return text
    start = max(0, min(at - SHOWN // 3, len(text) - SHOWN))
    return ("…" if start else "") + text[start:start + SHOWN] + ("…" if start + SHOWN < len(text) else "")


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _show(d: Event | None) -> str:
    if d is None:
        return "nothing"
    return _clip(_value(d), 0)


def difference(want: Event | None, found: Event | None) -> tuple[str, str]:
    """(expected, found) in a few words each: the event types, or for two events of one type the
    fields that differ, each value clipped around its first differing character."""
    if want is None or found is None or type(want) is not type(found):
        return _show(want), _show(found)
    tag = want.__struct_config__.tag
    fields = [f for f in want.__struct_fields__ if getattr(want, f) != getattr(found, f)]
    exp, got = [], []
    for f in fields:
        a, b = _value(getattr(want, f)), _value(getattr(found, f))
        at = _first_difference(a, b)
        exp.append(f"{f}={_clip(a, at)}")
        got.append(f"{f}={_clip(b, at)}")
    return f"{tag} {', '.join(exp)}", f"{tag} {', '.join(got)}"


class _Window:
    """One window's replay: its fresh policy, the decisions it expects next, the version that decided it."""

    __slots__ = ("policy", "expected", "recorded", "last_seq", "stopped")

    def __init__(self, recorded: str) -> None:
        self.policy = WindowPolicy()
        self.expected: deque[Decision] = deque()
        self.recorded = recorded
        self.last_seq = 0
        self.stopped = False  # it has parted from the log: nothing after can be compared


def audit(records: Iterable[tuple[int, str, Event]], policy_version: str | None = None) -> AuditResult:
    """records: (seq, window_id, event) in seq order. Events that are neither inputs nor decisions are skipped.

    `policy_version`: this build's (the digest window_opened records). A window whose recorded version
    differs and whose decisions this build makes differently is `not_replayed`, not a divergence: an
    upgrade that changes a decision's wording must not make every older log look forged. Without it,
    every window counts as decided by this build."""
    windows: dict[str, _Window] = {}
    n_in = n_dec = 0
    first: Divergence | None = None
    others: list[NotReplayed] = []

    def part(w: _Window, wid: str, seq: int, expected: str, found: str) -> None:
        nonlocal first
        w.stopped = True
        d = Divergence(seq, wid, expected, found)
        if policy_version is not None and w.recorded != policy_version:
            others.append(NotReplayed(wid, w.recorded, d))
        elif first is None:
            first = d

    for seq, wid, ev in records:
        if isinstance(ev, Input):
            w = windows.get(wid)
            if w is None:
                if not isinstance(ev, WindowOpened):
                    continue
                w = windows[wid] = _Window(ev.policy_sha256)
            if w.stopped:
                continue
            if w.expected:
                part(w, wid, seq, _show(w.expected[0]), f"input {ev.__struct_config__.tag}")
                continue
            n_in += 1
            try:
                w.expected.extend(w.policy.receive(ev))
            except Exception as exc:  # the recorded decisions were made without this: a damaged or forged input
                part(w, wid, seq, "the policy to take this input", f"it raised {type(exc).__name__}: {exc}")
                continue
            w.last_seq = seq
        elif isinstance(ev, Decision):
            n_dec += 1
            w = windows.get(wid)
            if w is not None and w.stopped:
                continue
            want = w.expected.popleft() if w is not None and w.expected else None
            if want != ev:
                if w is None:
                    if first is None:
                        first = Divergence(seq, wid, "nothing", _show(ev))
                    continue
                part(w, wid, seq, *difference(want, ev))
    for wid, w in windows.items():
        if w.expected and not w.stopped:
            part(w, wid, w.last_seq + 1, _show(w.expected[0]), "end of log")
    return AuditResult(first is None and not others, len(windows), n_in, n_dec, first, tuple(others))
