"""docs/fleet.md's set-up and drill, run as written from nothing against a real PostgreSQL server and
its streaming standby (issue 49)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psycopg

from tests.pgtools import PgServer

ROOT = Path(__file__).resolve().parent.parent
SETUP = "<!-- fleet-setup: tests/test_fleet_docs.py runs this block -->"
DRILL = "<!-- fleet-drill: tests/test_fleet_docs.py runs this block after the set-up -->"


def _block(mark: str) -> str:
    text = (ROOT / "docs" / "fleet.md").read_text()
    block = re.search(re.escape(mark) + r"\n```sh\n(.*?)\n```", text, re.S)
    assert block, f"docs/fleet.md lost its block {mark}"
    return block.group(1)


def _run(script: str, tmp: Path, primary: PgServer, standby: PgServer, timeout: float) -> subprocess.CompletedProcess:
    """The script in bash -euo pipefail, in a session of its own: whatever it left running is killed after."""
    runas = "runuser -u postgres -- " if primary.user else ""
    promote = tmp / "promote.sh"  # the drill's failover: the primary lost, the standby promoted
    promote.write_text(f"#!/bin/sh\nset -e\ncd /\n{runas}{primary.bin}/pg_ctl -D {primary.data} -m immediate -w stop\n"
                       f"{runas}{primary.bin}/pg_ctl -D {standby.data} -w -t 60 promote\n")
    promote.chmod(0o755)
    env = {**os.environ, "PGHOST": str(primary.sock), "PGPORT": "5432", "STANDBY": str(standby.sock),
           "PROMOTE": str(promote), "PLAN": str(ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{primary.bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=tmp, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _servers() -> tuple[PgServer, PgServer]:
    primary = PgServer()
    try:
        return primary, primary.standby(synchronous=True)
    except BaseException:
        primary.remove()
        raise


def test_the_fleet_set_up_in_the_docs_runs_from_nothing_as_written(tmp_path):
    script = _block(SETUP)
    # nothing after the bootstrap line runs as the server's superuser
    assert [line for line in script.splitlines() if "postgres" in line and not line.startswith("#")] == [
        'psql -U postgres -d postgres -v ON_ERROR_STOP=1 -c "CREATE ROLE flare_admin LOGIN CREATEDB CREATEROLE"']
    primary, standby = _servers()
    try:
        p = _run(script, tmp_path, primary, standby, timeout=300)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        assert "applied 001_init.sql" in p.stdout and "pool pool-a: 0 of 1 down" in p.stdout
        for host in ("gpu17", "gpu18"):  # each host's printed dsn line connects as that host's own role
            dsn = (tmp_path / f"{host}.dsn").read_text().strip().removeprefix("dsn = ").strip('"')
            assert str(standby.sock) in dsn and "target_session_attrs=read-write" in dsn  # every server, kept
            with psycopg.connect(dsn) as conn:
                assert conn.execute("SELECT current_user").fetchone() == (host,)
                assert conn.execute("SELECT host FROM leases").fetchall() == []
    finally:
        standby.remove()
        primary.remove()


def test_the_fleet_drill_in_the_docs_fails_over_recovers_a_restore_failed_lease_and_finishes_its_campaign(tmp_path):
    from tests.test_fleet_chaos import out_spans, peak
    primary, standby = _servers()
    try:
        p = _run(_block(SETUP) + "\n" + _block(DRILL), tmp_path, primary, standby, timeout=540)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        assert "server promoted" in p.stdout + p.stderr, p.stdout[-3000:] + p.stderr[-3000:]
        assert "2 of 2 runs done" in p.stdout, p.stdout[-3000:]
        new = standby.database_dsn("flare")
        with psycopg.connect(new) as conn:  # read on the promoted standby, as the superuser the checks use
            runs = conn.execute("SELECT host, state, outcome FROM runs ORDER BY host").fetchall()
            log = conn.execute("SELECT host, change, caller, (extract(epoch FROM at) * 1e9)::bigint FROM lease_log "
                               "ORDER BY id").fetchall()
            leases = conn.execute("SELECT host FROM leases").fetchall()
    finally:
        standby.remove()
        primary.remove()
    assert runs == [("gpu17", "done", "completed"), ("gpu18", "done", "restore_failed")]
    assert sorted(h for h, c, _by, _at in log if c == "taken") == ["gpu17", "gpu18"] and leases == []
    [freed] = [at for h, c, _by, at in log if (h, c) == ("gpu18", "released")]
    # from the hosts' own logs: never two primaries out. gpu18's window never readmitted it (a person did,
    # by hand, before releasing its lease), so its time out ends at the release, not never
    spans = [(t0, float(freed) if t1 == float("inf") else t1) for h in ("gpu17", "gpu18") for t0, t1 in out_spans(tmp_path / h / "state" / "log.db")]
    assert len(spans) == 2 and peak(spans) == 1, spans
