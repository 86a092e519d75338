"""`flare-diag log state`: a window's decider state, replayed from its log, in lines an auditor reads."""

from __future__ import annotations

import argparse
import sys

import msgspec

from flare_diag.daemon.cli.common import EXIT_FAILED, EXIT_OK, UsageError, integrity_warning
from flare_diag.events.base import BadEventError, UnknownEventError
from flare_diag.events.reader import LogReader
from flare_diag.policies.audit import StateAt, state_at
from flare_diag.policies.state import WindowSnapshot


def run_state(reader: LogReader, args: argparse.Namespace) -> int:
    windows = reader.window_ids()
    wid = args.window if args.window is not None else (windows[-1] if windows else None)
    if wid is None or wid not in windows:
        known = ", ".join(windows[-5:]) or "none"
        raise UsageError(f"{args.db}: no window {wid!r} in this log; expected one of its windows (latest: {known})")
    try:
        at = state_at(((e.seq, e.window_id, e.event()) for e in reader.iter(window_id=wid)), wid, args.at, args.minute)
    except (UnknownEventError, BadEventError) as exc:
        raise UsageError(f"{args.db}: {exc}") from None
    if at.seq == 0 and not at.refused:
        raise UsageError(f"{args.db}: window {wid} has no input at or before seq {args.at}; expected a later --at")
    damaged = integrity_warning(args.db)
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(at) + b"\n")
    else:
        print("\n".join(state_lines(at, wid)))
    return EXIT_FAILED if damaged or at.refused else EXIT_OK


def state_lines(at: StateAt, window_id: str) -> list[str]:
    s = at.state
    lines = [f"window {window_id}: this build's decider after its inputs up to seq {at.seq:,} "
             f"({s.inputs:,} input{'' if s.inputs == 1 else 's'}, the last {at.last_input})",
             f"stage {s.stage}, {_clock(s)}"]
    lines += _running(s) + _cells(s) + _abort(s) + _host(s) + _watches(s) + _restore(s) + _figures(s)
    d = at.divergence
    if d is not None:
        lines.append(f"NOTE: this build decides otherwise than the log from seq {d.seq:,} (this build: {d.expected}; "
                     f"the log: {d.found}): the state shown is this build's, not the recorded window's")
    if at.refused:
        lines.append(f"NOTE: the replay ended at {at.refused}: the state shown is the one before it")
    return lines


def _clock(s: WindowSnapshot) -> str:
    if s.minute is None:
        return "before minute 0 (nothing taken down yet)" if not s.took_down else "the take-down asked, minute 0 not yet answered"
    return f"minute {s.minute:g} (stop minute {s.stop_minute:g})"


def _running(s: WindowSnapshot) -> list[str]:
    out = []
    r = s.running
    if r is not None:
        since = "" if r.started_minute is None else f", since minute {r.started_minute:g}"
        out.append(f"running phase {r.id}: {r.done} of {r.total} requests{since}")
    if s.procedure:
        out.append("in " + " > ".join(s.procedure))
    w = s.waiting
    if w is None:
        out.append("no procedure running")
    elif w.actions:
        out.append("waiting for the answers to actions " + ", ".join(f"#{i}" for i in w.actions))
    elif w.until_minute is not None:
        out.append(f"waiting until minute {w.until_minute:g}")
    elif w.quiet:
        out.append("waiting until no action is outstanding")
    if s.outstanding:
        out.append("outstanding: " + ", ".join(f"#{o.action_id} {o.action}{' (experimental)' if o.experimental else ''}"
                                                for o in s.outstanding))
    return out


def _cells(s: WindowSnapshot) -> list[str]:
    recorded = sum(p in s.cells for p in s.required)
    out = [f"cells: {len(s.cells)} recorded ({recorded} of {len(s.required)} required)"]
    for phase, c in s.cells.items():
        why = "" if c.status == "measured" else f": {c.reason}"
        out.append(f"  {phase} {c.status}{why}")
    return out


def _abort(s: WindowSnapshot) -> list[str]:
    a = s.abort
    if a is None:
        return ["abort: none"]
    at = "" if a.minute is None else f" at minute {a.minute:g}"
    return [f"abort: {a.reason}{at}: {a.detail}"]


def _host(s: WindowSnapshot) -> list[str]:
    out = []
    inc = s.incumbent
    if inc is not None:
        sha = (inc.sha256 or "unknown")[:12]
        out.append(f"incumbent: {inc.recipe} (sha256 {sha}); taken down: {_yes(s.took_down)}; back: {_yes(s.incumbent_back)}")
    if s.candidate_loaded is not None:
        gone = "unloaded by the restore" if s.restore_unloaded else "loaded"
        out.append(f"candidate {s.candidate_loaded} (incarnation {s.candidate_id or 'unknown'}): {gone}")
    for label, why in {**s.failed_incarnations, **s.unverified_incarnations}.items():
        out.append(f"incarnation {label}: {why}")
    if s.loads_stopped:
        out.append(f"candidate loads stopped: {s.loads_stopped}")
    return out


def _watches(s: WindowSnapshot) -> list[str]:
    out = []
    if s.watch_answered_minute:
        out.append("watches answered: " + "; ".join(
            f"{src} {'before minute 0' if m is None else f'at minute {m:g}'}" for src, m in s.watch_answered_minute.items()))
    out += [f"watch {src} failing: {why}" for src, why in s.watch_failure.items()]
    if s.rules_disabled:
        out.append("rules the watches cannot enforce: " + ", ".join(s.rules_disabled))
    return out


def _restore(s: WindowSnapshot) -> list[str]:
    if s.restore_cause is None:
        return ["restore: not begun"]
    began = "" if s.restore_started_minute is None else f" at minute {s.restore_started_minute:g}"
    budget = "" if s.restore_end_minute is None else f", its budget to minute {s.restore_end_minute:g}"
    out = [f"restore: begun ({s.restore_cause}){began}{budget}; readmit sent: {_yes(s.readmit_requested)}"]
    if s.restore_faults:
        out.append("faults during the restore: " + "; ".join(s.restore_faults))
    return out


def _figures(s: WindowSnapshot) -> list[str]:
    f = s.working
    out = []
    if f.pace is not None:
        out.append(f"schedule estimate: pace x{f.pace:.2f} of the rate model + {f.overhead_s:.2f} s a request "
                   f"({f.rounds} rounds learned); a load {f.load_s:g} s")
    if f.resident_baseline_bytes is not None:
        out.append(f"growth baseline: {f.resident_baseline_bytes / 2**30:.2f} GiB resident; "
                   f"{f.growth_excess_runs} observations over the bound in a row")
    return out


def _yes(b: bool) -> str:
    return "yes" if b else "no"
