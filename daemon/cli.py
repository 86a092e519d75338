"""The `flare-diag` command line: offline tools and the client of the daemon's control socket."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class UsageError(Exception):
    """A user-caused error: one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not the usage block
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="flare-diag", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    log = sub.add_parser("log", help="verify, audit or export an event log")
    lsub = log.add_subparsers(dest="log_cmd", required=True, parser_class=_Parser)
    v = lsub.add_parser("verify", help="recompute the hash chain")
    v.add_argument("db", type=Path)
    v.add_argument("--checkpoint", type=Path, default=None,
                   help="checkpoint file (default: DB.checkpoint when present)")
    e = lsub.add_parser("export", help="write the log as JSON lines")
    e.add_argument("db", type=Path)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "log":
            from daemon.cli_log import run_log
            return run_log(args)
    except UsageError as exc:
        print(f"flare-diag: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
