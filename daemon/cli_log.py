"""`flare-diag log verify|export|audit`: offline checks of an event log."""

from __future__ import annotations

import argparse
import sys

import events.schema  # noqa: F401  (registers every event type)
from daemon.cli import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, UsageError
from events.base import UnknownEventError
from events.checkpoint import BadCheckpoint, default_path, read_checkpoint
from events.export import export_lines
from events.reader import LogReader
from events.sqlschema import NotAnEventLog
from events.verify import verify_log


def _open(db) -> LogReader:
    try:
        return LogReader(db)
    except NotAnEventLog as exc:
        raise UsageError(str(exc)) from None


def run_log(args: argparse.Namespace) -> int:
    if args.log_cmd == "verify":
        return _verify(args)
    if args.log_cmd == "export":
        return _export(args)
    if args.log_cmd == "audit":
        return _audit(args)
    return EXIT_BAD_INPUT


def _verify(args: argparse.Namespace) -> int:
    cp_path = args.checkpoint if args.checkpoint is not None else default_path(args.db)
    if args.checkpoint is not None and not cp_path.is_file():
        raise UsageError(f"{cp_path}: no such checkpoint file")
    try:
        cp = read_checkpoint(cp_path)
    except BadCheckpoint as exc:
        raise UsageError(str(exc)) from None
    with _open(args.db) as reader:
        res = verify_log(reader, cp)
    if res.ok:
        print(f"ok: {res.events} events, head seq {res.head_seq} hash {res.head_hash}"
              + (f", checkpoint seq {cp.seq} matches" if cp else ", no checkpoint"))
        return EXIT_OK
    print(f"FAILED at seq {res.first_bad_seq}: {res.problem}")
    return EXIT_FAILED


def _export(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    with _open(args.db) as reader:
        try:
            for line in export_lines(reader):
                out.write(line + b"\n")
        except UnknownEventError as exc:
            raise UsageError(f"{args.db}: {exc}") from None
    out.flush()
    return EXIT_OK


def audit_reader(reader: LogReader):
    from policies.audit import audit
    return audit((env.seq, env.window_id, env.event()) for env in reader.iter())


def _audit(args: argparse.Namespace) -> int:
    with _open(args.db) as reader:
        try:
            res = audit_reader(reader)
        except UnknownEventError as exc:
            raise UsageError(f"{args.db}: {exc}") from None
    if res.ok:
        print(f"ok: {res.windows} windows, {res.inputs} inputs replayed, {res.decisions} decisions match")
        return EXIT_OK
    d = res.divergence
    print(f"DIVERGED at seq {d.seq} (window {d.window_id}): expected {d.expected}, found {d.found}")
    return EXIT_FAILED
