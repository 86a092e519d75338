"""Crash safety: a writer killed with SIGKILL at random moments never loses an acknowledged event."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from flare_diag.events.checkpoint import default_path, read_checkpoint
from flare_diag.events.reader import LogReader
from flare_diag.events.verify import verify_log

ROOT = Path(__file__).resolve().parent.parent


def _run_and_kill(db: Path, rng: random.Random) -> set[int]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.crash_appender", str(db)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    acked: set[int] = set()
    want = rng.randint(1, 400)
    deadline = time.monotonic() + 30
    assert proc.stdout is not None
    while len(acked) < want and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        acked.add(int(line))
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate()
    # lines already written before the kill are acknowledgements too
    acked.update(int(x) for x in rest.split())
    return acked


def test_sigkill_at_random_moments_loses_no_acknowledged_event(tmp_path):
    rng = random.Random(20261022)
    db = tmp_path / "log.db"
    all_acked: set[int] = set()
    for _round in range(20):
        acked = _run_and_kill(db, rng)
        assert acked, "the appender acknowledged nothing before it was killed"
        all_acked |= acked
        with LogReader(db) as r:
            present = {row[0] for row in r.conn.execute("SELECT seq FROM events")}
            res = verify_log(r, read_checkpoint(default_path(db)))
        assert all_acked <= present, f"lost acknowledged seqs {sorted(all_acked - present)[:5]}"
        assert res.ok, res.problem
        assert present == set(range(1, max(present) + 1))
