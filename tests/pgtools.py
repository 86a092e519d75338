"""A throwaway PostgreSQL server for the fleet's tests: initdb and pg_ctl into a temporary folder,
listening on a unix socket only, stopped by the tests themselves. No mock database anywhere."""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_COUNTER = itertools.count()


def bindir() -> Path | None:
    """Debian's server binaries (`postgresql` package), newest major first; None when not installed."""
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if Path(d, "initdb").exists() and Path(d, "pg_ctl").exists():
            return Path(d)
    pg_config = shutil.which("pg_config")
    if pg_config:
        d = Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip())
        if (d / "initdb").exists():
            return d
    return None


class PgServer:
    """One server: `dsn` for its `postgres` database; `database()` makes a fresh one per test."""

    def __init__(self) -> None:
        self.bin = bindir()
        if self.bin is None:
            if os.environ.get("CI"):
                raise RuntimeError("PostgreSQL's server binaries are missing; .ci/run installs Debian's postgresql")
            pytest.skip("PostgreSQL's server binaries are not installed (apt install postgresql)")
        # its own folder under /tmp, not pytest's (0700 root's): the server may run as another user
        root = self.root = Path(tempfile.mkdtemp(prefix="flare-diag-pg-"))
        self.data = root / "data"
        self.sock = root / "sock"
        self.sock.mkdir(parents=True)
        # initdb refuses to run as root: the server then runs as Debian's postgres user
        self.user = None
        if os.geteuid() == 0:
            self.user = pwd.getpwnam("postgres")
            for p in (root, self.sock):
                os.chown(p, self.user.pw_uid, self.user.pw_gid)
        self._run(["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        self.start()

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / argv[0]), *argv[1:]]
        if self.user is not None:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and p.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {p.stdout}{p.stderr}")
        return p

    @property
    def dsn(self) -> str:
        return self.database_dsn("postgres")

    def database_dsn(self, name: str) -> str:
        return f"host={self.sock} port=5432 dbname={name} user=postgres"

    def start(self) -> None:
        opts = f"-k {self.sock} -c listen_addresses='' -c port=5432 -c max_connections=300 -c fsync=off"
        self._run(["pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "server.log"), "-w", "-t", "60", "start"])

    def stop(self, mode: str = "fast") -> None:
        self._run(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"], check=False)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def standby(self, synchronous: bool = True) -> "PgServer":
        """A streaming-replication standby of this server (pg_basebackup -R: standby.signal and its
        primary_conninfo), on a socket folder of its own; `synchronous`: the primary's commits wait for it."""
        sb = PgServer.__new__(PgServer)
        sb.bin, sb.user = self.bin, self.user
        sb.root = Path(tempfile.mkdtemp(prefix="flare-diag-pg-standby-"))
        sb.data, sb.sock = sb.root / "data", sb.root / "sock"
        sb.sock.mkdir(parents=True)
        if self.user is not None:
            for p in (sb.root, sb.sock):
                os.chown(p, self.user.pw_uid, self.user.pw_gid)
        self._run(["pg_basebackup", "-h", str(self.sock), "-p", "5432", "-U", "postgres", "-D", str(sb.data), "-R",
                   "-X", "stream", "--no-sync", "-c", "fast"])
        with open(sb.data / "postgresql.auto.conf", "a") as f:
            f.write("primary_conninfo = 'host=%s port=5432 user=postgres application_name=standby'\n" % self.sock)
        sb.start()
        if synchronous:
            import psycopg
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
                conn.execute("SELECT pg_reload_conf()")
        return sb

    def promote(self) -> None:
        self._run(["pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote"])

    def database(self) -> str:
        """A new, empty database on this server; its DSN."""
        import psycopg
        name = f"fleet_{os.getpid()}_{next(_COUNTER)}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.database_dsn(name)


def role_dsn(dsn: str, role: str, group: str = "flare_diag_host") -> str:
    """`dsn` as the login role `role`, a member of `group` (made as `fleet host add` makes a host's):
    what the daemon and the CLI connect as under test, never the superuser."""
    import re

    import psycopg
    from psycopg import sql
    # roles are the server's, not a database's: made through its `postgres` database (the DSN's own may not exist)
    with psycopg.connect(re.sub(r"dbname=\S+", "dbname=postgres", dsn), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (group,)).fetchone() is None:
            # as the migrations make it: a test whose fleet database was never migrated (an unreachable
            # one) may be the first on this server to need a host's role
            conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(group)))
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(role)))
    return re.sub(r"user=\S+", f"user={role}", dsn)
