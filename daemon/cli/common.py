"""What every command shares: exit codes, the one-line user error, consoles and the integrity warning."""

from __future__ import annotations

import sys
from typing import TextIO, cast
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_BUSY = 4  # `start`: the daemon is running another window, or the fleet pool is full (try again); 3 is restore_failed
EXIT_UNREACHABLE = 5  # the daemon's socket does not answer: nothing was asked of it

EXIT_CODES = ("exit codes: 0 completed (every required cell measured, incumbent restored and verified) or the "
              "command succeeded; 1 partial or aborted with the incumbent restored, or an offline check failed; 2 bad "
              "input or a refusal before anything changed; 3 the restoration did not verify: the primary needs a "
              "person; 4 busy (the daemon runs another window, or the fleet pool is full); 5 the daemon is not reachable")


class UsageError(Exception):
    """A user-caused error: one line, exit code 2."""


def make_console(stderr: bool = False, guarded: bool = False):
    """A rich console that wraps for a terminal and never for a pipe or a file (a path or a sentence
    split at column 80 is no use to a script or a log). `guarded`: its stream may close under it
    (a foreground window's display), and nothing it writes can fail the caller."""
    from rich.console import Console
    if guarded:
        from flare_diag.daemon.cli.display import GuardedStream
        # a TextIOBase, which rich writes to and flushes like the IO[str] its signature names
        c = Console(file=cast(TextIO, GuardedStream(sys.stderr if stderr else sys.stdout)))
    else:
        c = Console(stderr=stderr)
    if not c.is_terminal:
        c.soft_wrap = True
        c.width = 1000  # a table's cells then keep their lines whole as well (rich sizes tables to the width)
    return c


def integrity_warning(db: Path) -> bool:
    """Says on stderr, in one line, when a log a command reads does not verify (its hash chain); True then."""
    from flare_diag.events.sqlschema import NotAnEventLog
    from flare_diag.events.verify import verify_path
    try:
        res = verify_path(db, None)
    except NotAnEventLog:
        raise  # not a log at all: the command's own one line says so
    except Exception as exc:  # noqa: BLE001 - unreadable to the end: damaged all the same
        print(f"flare-diag: warning: {db} cannot be verified ({type(exc).__name__}: {one_line(exc)}); what is read "
              f"from it may be damaged or forged", file=sys.stderr)
        return True
    if res.ok:
        return False
    print(f"flare-diag: warning: {db} does not verify (first bad seq {res.first_bad_seq}: {res.problem}); what is "
          f"read from it may be damaged or forged", file=sys.stderr)
    return True


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def ranged(flag: str, kind: type = int):
    """An argparse `type=` for `flag`: its value as `kind`, within policies/ranges.FLAG_RANGES (argparse
    says the refusal in one line, exit 2)."""
    import argparse
    import math

    def parse(text: str):
        from flare_diag.policies.ranges import FLAG_RANGES  # when a value is parsed, not when the parser is built
        rng = FLAG_RANGES[flag]
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {'a whole number' if kind is int else 'a number'} "
                                             f"in {rng.words()} ({rng.why})") from None
        if not (math.isfinite(value) and rng.holds(value)):
            raise argparse.ArgumentTypeError(f"{text}: expected {rng.words()} ({rng.why})")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse
