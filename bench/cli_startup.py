"""What a CLI call costs before it does anything, side by side in one run: the CPU of `flare-diag status`
against a daemon that is not there (parse the command line, fail to connect, print one line), of
`flare-diag --help`, and of a bare interpreter start, alternated call by call. Then the two commands that
only read (issue 49: within 3x a bare interpreter plus the query), by wall time, median of the rounds:
`flare-diag status` against a real flare-diagd (the query: the same status asked over the socket from a
process already running), and `flare-diag fleet status` against a real PostgreSQL as an operator's role
(the query: psql running the same statement, its own start and connection included; the command reads
through libpq itself, and psycopg's import is shown for what that spares).

An operator's shell, a completion script and the test suite (hundreds of calls a run) all pay this on
every call. Figures: docs/performance.md.

Usage: python bench/cli_startup.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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
        _cpu_figures(kinds, spent, args.rounds)
        return _reading_commands(args.rounds, env)


def _cpu_figures(kinds: dict, spent: dict[str, float], rounds: int) -> None:
    mean = {k: v / rounds for k, v in spent.items()}
    bare = max(mean["bare interpreter"], 1e-6)
    for k, v in mean.items():
        print(f"{k:32} {v * 1000:7.1f} ms of CPU a call (mean of {rounds})")
    for k in list(kinds)[1:]:
        print(f"ratio {k}/bare interpreter: {mean[k] / bare:.1f}")


def _wall_of(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{argv[:4]}: exit {p.returncode}: {p.stderr.decode()[-300:]}")
    return took


def _reading_commands(rounds: int, env: dict[str, str]) -> int:
    """`status` against a live daemon and `fleet status` against a live database, by wall time."""
    import anyio

    from flare_diag.daemon.cli.client import Connection
    from flare_diag.daemon.fleet.db import migrate
    from flare_diag.daemon.fleet.reads import STATUS_SQL
    from flare_diag.daemon.service import control
    from tests.pgtools import PgServer, role_dsn
    cli = [sys.executable, "-m", "flare_diag.daemon.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        sock, state = Path(tmp) / "control.sock", Path(tmp) / "state"
        daemon = subprocess.Popen([sys.executable, "-m", "flare_diag.daemon", "--socket", str(sock), "--state-dir",
                                   str(state), "--sites-dir", tmp], cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        pg = PgServer()
        try:
            deadline = time.monotonic() + 60
            while not sock.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            dsn = pg.database()
            anyio.run(migrate, dsn)
            operator = role_dsn(dsn, "alice", "flare_diag_operator")

            def socket_query() -> None:
                c = Connection(sock)
                try:
                    c.call(control.Status())
                finally:
                    c.close()

            kinds = {
                "bare interpreter": lambda: _wall_of([sys.executable, "-c", "pass"], env),
                "flare-diag status": lambda: _wall_of([*cli, "status", "--socket", str(sock)], env),
                "status query (socket, in process)": lambda: _timed(socket_query),
                "psycopg's own import": lambda: _wall_of([sys.executable, "-c", "import psycopg"], env),
                "flare-diag fleet status": lambda: _wall_of([*cli, "fleet", "status", "--dsn", operator], env),
                "psql, the same query": lambda: _wall_of([str(pg.bin / "psql"), "-X", "-q", "-d", operator, "-c",
                                                          STATUS_SQL], env),
            }
            for run in kinds.values():  # bytecode compiled, caches warm, outside the figures
                run()
            took: dict[str, list[float]] = {k: [] for k in kinds}
            for _ in range(max(rounds, 1)):
                for k, run in kinds.items():
                    took[k].append(run())
        finally:
            daemon.kill()
            daemon.wait()
            pg.remove()
    med = {k: statistics.median(v) for k, v in took.items()}
    for k, v in med.items():
        print(f"{k:36} {v * 1000:7.1f} ms wall a call (median of {len(took[k])})")
    bare = med["bare interpreter"]
    for cmd, query in (("flare-diag status", "status query (socket, in process)"),
                       ("flare-diag fleet status", "psql, the same query")):
        print(f"ratio ({cmd} - {query})/bare interpreter: {(med[cmd] - med[query]) / bare:.1f} (target 3)")
    return 0


def _timed(fn) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
