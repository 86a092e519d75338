"""docs/fleet.md's set-up, run as written from nothing against a real PostgreSQL server (issue 49)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg

from tests.pgtools import PgServer

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- fleet-setup: tests/test_fleet_docs.py runs this block -->"


def _setup_script() -> str:
    text = (ROOT / "docs" / "fleet.md").read_text()
    block = re.search(re.escape(MARK) + r"\n```sh\n(.*?)\n```", text, re.S)
    assert block, "docs/fleet.md lost its fleet-setup block"
    return block.group(1)


def test_the_fleet_set_up_in_the_docs_runs_from_nothing_as_written(tmp_path):
    script = _setup_script()
    # nothing after the bootstrap line runs as the server's superuser
    assert [line for line in script.splitlines() if "postgres" in line and not line.startswith("#")] == [
        'psql -U postgres -d postgres -v ON_ERROR_STOP=1 -c "CREATE ROLE flare_admin LOGIN CREATEDB CREATEROLE"']
    pg = PgServer()
    try:
        env = {**os.environ, "PGHOST": str(pg.sock), "PGPORT": "5432",
               "PLAN": str(ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{pg.bin}{os.pathsep}{os.environ.get('PATH', '')}"}
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        assert "applied 001_init.sql" in p.stdout and "pool pool-a: 0 of 1 down" in p.stdout
        assert "0 of 2 runs done" in p.stdout
        for host in ("gpu17", "gpu18"):  # each host's printed dsn line connects as that host's own role
            dsn = (tmp_path / f"{host}.dsn").read_text().strip().removeprefix("dsn = ").strip('"')
            with psycopg.connect(dsn) as conn:
                assert conn.execute("SELECT current_user").fetchone() == (host,)
                assert conn.execute("SELECT host FROM runs").fetchall() == [(host,)]  # its own run, no other host's
    finally:
        pg.remove()
