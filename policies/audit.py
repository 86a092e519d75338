"""The one replayer of a log: a window's recorded inputs fed to a policy, each decision it makes held to
the one the log holds. `log audit` and the reports replay every window into fresh policies (`audit`);
a resume replays its window into the policy that carries it on (`WindowReplay(policy, follow=True)`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import msgspec

from flare_diag.events.base import Event
from flare_diag.events.schema import Decision, Input, WindowOpened, window_minute
from flare_diag.policies.snapshot import snapshot
from flare_diag.policies.state import WindowSnapshot
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


class WindowReplay:
    """One window's events, in log order, fed to `policy`: every input is given to it, and every
    recorded decision is held to the next one it made. `divergence` is the first that differs (None:
    all equal so far). After one, an audit stops comparing and feeding (nothing after can be compared);
    `follow` keeps feeding the inputs, so that the policy reaches the log's last state whatever it decided."""

    __slots__ = ("policy", "expected", "follow", "divergence", "parted_after", "inputs", "decisions", "last_seq", "last_input")

    def __init__(self, policy: WindowPolicy | None = None, follow: bool = False) -> None:
        self.policy = policy if policy is not None else WindowPolicy()
        self.expected: deque[Decision] = deque()
        self.follow = follow
        self.divergence: Divergence | None = None
        self.parted_after = (0, "")  # at the divergence: how many inputs had been fed, and the last one's tag
        self.inputs = 0
        self.decisions = 0
        self.last_seq = 0
        self.last_input = ""  # the tag of the latest input fed

    def feed(self, seq: int, window_id: str, ev: Event) -> None:
        if isinstance(ev, Input):
            self._input(seq, window_id, ev)
        elif isinstance(ev, Decision):
            self._decision(seq, window_id, ev)

    def end(self, window_id: str) -> None:
        """The log ends here: a decision the policy made that the log does not hold is a divergence."""
        if self.expected and self.divergence is None:
            self._part(self.last_seq + 1, window_id, _show(self.expected[0]), "end of log")

    def _input(self, seq: int, window_id: str, ev: Input) -> None:
        if self.divergence is not None and not self.follow:
            return
        if self.expected and self.divergence is None:
            self._part(seq, window_id, _show(self.expected[0]), f"input {_tag(ev)}")
            if not self.follow:
                return
        self.inputs += 1
        self.last_input = _tag(ev)
        try:
            made = self.policy.receive(ev)
        except Exception as exc:  # the recorded decisions were made without this: a damaged or forged input
            if self.follow:
                raise
            self._part(seq, window_id, "the policy to take this input", f"it raised {type(exc).__name__}: {exc}")
            return
        self.last_seq = seq
        if self.divergence is None:
            self.expected.extend(made)

    def _decision(self, seq: int, window_id: str, ev: Decision) -> None:
        self.decisions += 1
        if self.divergence is not None:
            return
        want = self.expected.popleft() if self.expected else None
        if want != ev:
            self._part(seq, window_id, *difference(want, ev))

    def _part(self, seq: int, window_id: str, expected: str, found: str) -> None:
        self.divergence = Divergence(seq, window_id, expected, found)
        self.parted_after = (self.inputs, self.last_input)
        self.expected.clear()


def _tag(ev: Event) -> str:
    return str(ev.__struct_config__.tag)


def audit(records: Iterable[tuple[int, str, Event]], policy_version: str | None = None) -> AuditResult:
    """records: (seq, window_id, event) in seq order. Events that are neither inputs nor decisions are skipped.

    `policy_version`: this build's (the digest window_opened records). A window whose recorded version
    differs and whose decisions this build makes differently is `not_replayed`, not a divergence: an
    upgrade that changes a decision's wording must not make every older log look forged. Without it,
    every window counts as decided by this build."""
    windows: dict[str, tuple[WindowReplay, str]] = {}  # window id -> its replay, the version that decided it
    strays: list[Divergence] = []  # decisions of no window the log opened
    for seq, wid, ev in records:
        if isinstance(ev, WindowOpened) and wid not in windows:
            windows[wid] = (WindowReplay(), ev.policy_sha256)
        if wid in windows:
            windows[wid][0].feed(seq, wid, ev)
        elif isinstance(ev, Decision):
            strays.append(Divergence(seq, wid, "nothing", _show(ev)))
    # in the order the log shows them: divergences met in the log, then what windows left unmade at its end
    met: list[tuple[Divergence, str | None]] = sorted([(d, None) for d in strays] + [(r.divergence, v) for r, v in windows.values() if r.divergence],
                 key=lambda dv: dv[0].seq)
    for wid, (r, _v) in windows.items():
        r.end(wid)
    unmade: list[tuple[Divergence, str | None]] = [(r.divergence, v) for r, v in windows.values() if r.divergence and r.divergence.found == "end of log"]
    first: Divergence | None = None
    others: list[NotReplayed] = []
    for d, recorded in met + unmade:
        if recorded is not None and policy_version is not None and recorded != policy_version:
            others.append(NotReplayed(d.window_id, recorded, d))
        elif first is None:
            first = d
    n_in = sum(r.inputs for r, _v in windows.values())
    n_dec = len(strays) + sum(r.decisions for r, _v in windows.values())
    return AuditResult(first is None and not others, len(windows), n_in, n_dec, first, tuple(others))


class StateAt(msgspec.Struct, frozen=True):
    """One window's decider state after the log's inputs up to a seq, replayed by this build."""

    seq: int  # the last input fed (0: none)
    last_input: str  # its tag
    state: WindowSnapshot
    divergence: Divergence | None  # where this build first decided otherwise than the log, if before `seq`
    refused: str = ""  # the input this build's decider could not take (a damaged or forged log): the replay ends there


def state_at(records: Iterable[tuple[int, str, Event]], window_id: str, upto_seq: int | None = None,
             upto_minute: float | None = None) -> StateAt:
    """`window_id`'s inputs up to `upto_seq` and window minute `upto_minute` (all, when None) fed to a fresh
    decider, every recorded decision held to its own; the state is this build's (where it decides
    otherwise, `divergence` says so). Inputs before minute 0 (the take-down) come before any minute."""
    replay = WindowReplay(follow=True)
    for seq, wid, ev in records:
        if upto_seq is not None and seq > upto_seq:
            break
        if wid != window_id:
            continue
        if upto_minute is not None and isinstance(ev, Input) and _past(ev, replay.policy.state.t0, upto_minute):
            break
        try:
            replay.feed(seq, wid, ev)
        except Exception as exc:  # the recorded decisions were made without this: say where, and stop
            why = f"seq {seq}: the decider cannot take this input ({type(exc).__name__}: {exc})"
            return StateAt(replay.last_seq, replay.last_input, snapshot(replay.policy, replay.inputs), replay.divergence, why)
    return StateAt(replay.last_seq, replay.last_input, snapshot(replay.policy, replay.inputs), replay.divergence)


def _past(ev: Input, t0: int | None, minute: float) -> bool:
    m = window_minute(ev.at_ns, t0)
    return m is not None and m > minute
