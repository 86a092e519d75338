"""What a CLI call costs before it does anything, side by side in one run: the CPU of `flare-diag status`
against a daemon that is not there (parse the command line, fail to connect, print one line), of
`flare-diag --help`, and of a bare interpreter start, alternated call by call.

An operator's shell, a completion script and the test suite (hundreds of calls a run) all pay this on
every call. Figures: docs/performance.md.

Usage: python bench/cli_startup.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """User and system CPU seconds of one child process, from the children's rusage before and after."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8, help="calls of each kind, alternated (default 8)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        # the bytecode cached as an installed package's is: a first call compiles, later ones do not
        env = {**os.environ, "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pycache")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        cli = [sys.executable, "-m", "flare_diag.daemon.cli"]
        kinds = {
            "bare interpreter": [sys.executable, "-c", "pass"],
            "flare-diag status (no daemon)": [*cli, "status", "--socket", str(Path(tmp) / "absent.sock")],
            "flare-diag --help": [*cli, "--help"],
        }
        for argv_ in kinds.values():  # compile once, outside the figures
            _cpu_of(argv_, env)
        spent = {k: 0.0 for k in kinds}
        for _ in range(args.rounds):
            for k, argv_ in kinds.items():
                spent[k] += _cpu_of(argv_, env)
    mean = {k: v / args.rounds for k, v in spent.items()}
    bare = max(mean["bare interpreter"], 1e-6)
    for k, v in mean.items():
        print(f"{k:32} {v * 1000:7.1f} ms of CPU a call (mean of {args.rounds})")
    for k in list(kinds)[1:]:
        print(f"ratio {k}/bare interpreter: {mean[k] / bare:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
