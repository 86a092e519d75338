"""`flare-diag log verify|export|audit|state`: offline checks of an event log."""

from __future__ import annotations

import argparse
import sqlite3
import json
import sys

import flare_diag.events.schema  # noqa: F401  (registers every event type)
from flare_diag.daemon.cli.common import (
    EXIT_BAD_INPUT, EXIT_BUSY, EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, UsageError, integrity_warning,
)
from flare_diag.daemon.reports.publish import audit_log, not_replayed_words
from flare_diag.events.base import UnknownEventError
from flare_diag.events.checkpoint import BadCheckpoint, default_path, mac_ok, read_checkpoint
from flare_diag.events.export import export_lines
from flare_diag.events.reader import LogReader
from flare_diag.events.sqlschema import NotAnEventLog
from flare_diag.events.verify import integrity_problems, verify_log


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
    if args.log_cmd == "state":
        from flare_diag.daemon.cli.log_state import run_state
        with _open(args.db) as reader:
            return run_state(reader, args)
    if args.log_cmd == "archive":
        return _archive(args)
    if args.log_cmd == "backup":
        from flare_diag.events.archive import ArchiveError, backup_log
        try:
            seq, h = backup_log(args.db, args.dest)
        except (ArchiveError, NotAnEventLog) as exc:
            raise UsageError(str(exc)) from None
        print(f"ok: {args.dest} holds {args.db} up to seq {seq} (hash {h}), verified")
        return EXIT_OK
    return EXIT_BAD_INPUT


def _archive(args: argparse.Namespace) -> int:
    from flare_diag.events.archive import Archived, ArchiveError, archive_log
    from flare_diag.events.store import LogBusy
    if args.db is None:
        if args.to is not None or args.key is not None:
            raise UsageError("log archive without DB: the daemon archives into its own state directory with its own key; "
                             "expected no --to or --key")
        import msgspec

        from flare_diag.daemon.cli import client
        from flare_diag.daemon.service import control
        try:
            c = client.Connection(client.socket_path(args.socket), timeout=600)
        except client.DaemonUnreachable as exc:
            print(f"flare-diag: error: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE
        try:
            rep = c.call(control.Archive(before=args.before))
        except client.Refused as exc:
            if exc.code == "busy":
                print(f"flare-diag: busy: the daemon refused archive: {exc}", file=sys.stderr)
                return EXIT_BUSY
            raise UsageError(f"the daemon refused archive: {exc}") from None
        finally:
            c.close()
        done = msgspec.convert({k: v for k, v in rep.items() if k != "ok"}, Archived) if rep.get("archive") else None
        log = "the daemon's log"
    else:
        log = str(args.db)
        if args.to is None:
            raise UsageError("log archive DB: expected --to DIR (the folder the archive log is written to)")
        key = _key(args.key) if args.key else None
        try:
            done = archive_log(args.db, args.before, args.to, key)
        except (ArchiveError, LogBusy, NotAnEventLog) as exc:
            raise UsageError(str(exc)) from None
    if args.json:
        import msgspec
        print(json.dumps(msgspec.to_builtins(done) if done else {"archive": None, "windows": []}))
        return EXIT_OK
    if done is None:
        print(f"{log}: no window closed before {args.before}; nothing archived")
        return EXIT_OK
    print(f"archived {len(done.windows)} window(s), seq {done.first_seq}-{done.last_seq} ({done.events} events) "
          f"to {done.archive}; head hash {done.head_hash} recorded in {log}")
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    cp_path = args.checkpoint if args.checkpoint is not None else default_path(args.db)
    if args.checkpoint is not None and not cp_path.is_file():
        raise UsageError(f"{cp_path}: no such checkpoint file")
    try:
        cp = read_checkpoint(cp_path)
    except BadCheckpoint as exc:
        raise UsageError(str(exc)) from None
    anchor = _anchor(args.anchor) if args.anchor else None
    key = _key(args.key) if args.key else None
    if key is not None:
        if cp is None:
            print(f"FAILED: {cp_path}: no checkpoint to check the key against")
            return EXIT_FAILED
        if not mac_ok(cp, key):
            print(f"FAILED: {cp_path}: the checkpoint's signature does not verify under {args.key} "
                  f"(rewritten, or signed with another key)" if cp.mac else f"FAILED: {cp_path}: the checkpoint is not signed")
            return EXIT_FAILED
    with _open(args.db) as reader:
        damaged = integrity_problems(reader)  # first: a malformed file names its bad page here, not in a crash below
        if damaged and not getattr(args, "json", False):
            for d in damaged:
                print(f"SQLITE INTEGRITY CHECK FAILED: {d}")
        try:
            res = verify_log(reader, cp, anchor)
            changed = preserved_changes(reader)
        except sqlite3.DatabaseError:
            if not damaged:
                raise
            print(f"FAILED: {args.db}: the SQLite file is damaged (above), so its chain cannot be walked")
            return EXIT_FAILED
    if getattr(args, "json", False):
        print(json.dumps({"ok": res.ok and not changed, "events": res.events, "head_seq": res.head_seq,
                          "head_hash": res.head_hash, "checkpoint_seq": cp.seq if cp else None,
                          "signature_verified": key is not None, "anchor_seq": anchor.seq if anchor else None,
                          "first_bad_seq": res.first_bad_seq, "problem": res.problem, "preserved_changed": changed,
                          "sqlite_integrity": damaged or "ok"}))
        return EXIT_OK if res.ok and not changed and not damaged else EXIT_FAILED
    if res.ok and damaged:  # the chain may verify while the file's pages do not
        print(f"the chain verifies ({res.events} events, head seq {res.head_seq}), but the SQLite file is damaged")
        return EXIT_FAILED
    for c in changed:  # the chain may hold, and still record that a window broke its promise
        print(f"PRESERVED HISTORY CHANGED: {c['path']} in window {c['window_id']} (seq {c['seq']}): sha256 "
              f"{str(c['was'])[:12]} before the window, {str(c['now'])[:12] if c['now'] else 'missing'} after publishing")
    if res.ok and changed:
        print(f"the chain verifies ({res.events} events, head seq {res.head_seq}), but {len(changed)} preserved "
              f"path(s) changed")
        return EXIT_FAILED
    if res.ok:
        print(f"ok: {res.events} events, head seq {res.head_seq} hash {res.head_hash}"
              + (f", checkpoint seq {cp.seq} matches" if cp else ", no checkpoint")
              + (" and its signature verifies" if key is not None else "")
              + (f", anchor seq {anchor.seq} matches" if anchor else ""))
        return EXIT_OK
    print(f"FAILED at seq {res.first_bad_seq}: {res.problem}")
    return EXIT_FAILED


def preserved_changes(reader) -> list[dict]:
    """Every preserved path a window's log records as changed once its reports were out."""
    out = []
    for env in reader.iter(types=("preserved_checked",)):
        ev = env.event()
        if ev.when != "after_publishing":
            continue
        out += [{"path": p, "window_id": env.window_id, "seq": env.seq, "was": d.get("was"), "now": d.get("sha256")}
                for p, d in ev.paths.items() if d.get("unchanged") is False]
    return out


def _anchor(spec: str):
    """A published head: a report.json (its integrity.head_seq and head_hash) or SEQ:HASH."""
    import json
    from pathlib import Path

    from flare_diag.events.checkpoint import Checkpoint
    given: object = None  # the seq as written (text) or as a report.json holds it
    h: object = None
    if ":" in spec and not Path(spec).exists():
        given, _, h = spec.partition(":")
    else:
        try:
            integ = json.loads(Path(spec).read_bytes())["integrity"]
            given, h = integ["head_seq"], integ["head_hash"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--anchor {spec}: expected a report.json or SEQ:HASH ({type(exc).__name__})") from None
    try:
        seq = int(given)  # type: ignore[call-overload]  # whatever was given: int() refuses what is not a number
        if seq < 0 or len(bytes.fromhex(str(h))) != 32:
            raise ValueError
    except (TypeError, ValueError):
        raise UsageError(f"--anchor {spec}: expected a seq and a 64-hex-digit hash") from None
    return Checkpoint(seq=seq, hash=str(h))


def _key(path) -> bytes:
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise UsageError(f"--key {path}: cannot read ({exc.strerror})") from None
    if not key:
        raise UsageError(f"--key {path}: is empty")
    return key


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


def _audit(args: argparse.Namespace) -> int:
    with _open(args.db) as reader:
        try:
            res = audit_log(reader)
        except UnknownEventError as exc:
            raise UsageError(f"{args.db}: {exc}") from None
    damaged = integrity_warning(args.db)  # decisions that replay from a forged log prove nothing
    if getattr(args, "json", False):
        def where(d):
            return {"seq": d.seq, "window_id": d.window_id, "expected": d.expected, "found": d.found}
        d = res.divergence
        print(json.dumps({"ok": res.ok, "windows": res.windows, "inputs": res.inputs, "decisions": res.decisions,
                          "divergence": None if d is None else where(d),
                          "not_replayed": [{"window_id": x.window_id, "policy_sha256": x.policy_sha256, **where(x.at)}
                                           for x in res.not_replayed]}))
        return EXIT_OK if res.ok and not damaged else EXIT_FAILED
    if res.ok:
        print(f"{'decisions match, but the log does not verify' if damaged else 'ok'}: {res.windows} windows, "
              f"{res.inputs} inputs replayed, {res.decisions} decisions match")
        return EXIT_FAILED if damaged else EXIT_OK
    d = res.divergence
    if d is not None:
        print(f"DIVERGED at seq {d.seq} (window {d.window_id}): expected {d.expected}, found {d.found}")
    for x in res.not_replayed:
        print(f"NOT REPLAYED: {not_replayed_words(x)}")
    replayed = res.windows - len(res.not_replayed)
    if d is None and replayed:
        print(f"{'the log does not verify; ' if damaged else ''}the other {replayed} of {res.windows} windows replayed: "
              f"their decisions match")
    return EXIT_FAILED
