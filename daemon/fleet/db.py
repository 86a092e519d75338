"""Connections to the fleet database and its migrations: plain versioned SQL files, applied in order."""

from __future__ import annotations

import re

import psycopg
from psycopg.types.string import BytesBinaryDumper

from flare_diag.daemon.fleet.dsn import CONNECT_TIMEOUT_S, FleetError, redact
from flare_diag.resources import resource


def migrations() -> list[tuple[int, str, str]]:
    """(version, file name, SQL) of every shipped migration, in order."""
    folder = resource("flare_diag.daemon.fleet", "migrations")
    out = []
    for f in folder.iterdir():
        m = re.match(r"^(\d{3})_[a-z0-9_]+\.sql$", f.name)
        if m:
            out.append((int(m.group(1)), f.name, f.read_text()))
    return sorted(out)


async def connect(dsn: str, autocommit: bool = False) -> psycopg.AsyncConnection:
    """A connection, or FleetError naming the database (never its password) and why."""
    try:
        # no server-side prepared statements: a shipper's few statements parse in microseconds, and
        # psycopg's automatic preparing cost more than it saved (bench/fleet.py's steady state, 250
        # hosts in one process: batch lag p99 2.05 s with it, 0.59 s without; docs/performance.md)
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S,
                                                     prepare_threshold=None)
    except psycopg.Error as exc:
        raise FleetError(f"fleet database {redact(dsn)}: cannot connect ({one_line(exc)})") from None
    # A binary COPY typed with set_types() finds its dumpers by oid, and for bytea that is the last one
    # registered: DB-API's Binary dumper, in Python, three calls a shipped row. The bytes dumper
    # registered by oid alone (cls None: psycopg's documented case for COPY) is its C version.
    conn.adapters.register_dumper(None, BytesBinaryDumper)
    return conn


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


async def migrate(dsn: str) -> list[str]:
    """Applies the migrations the database lacks, each in one transaction; returns those applied."""
    applied = []
    async with await connect(dsn) as conn:
        async with conn.transaction():
            await conn.execute("CREATE TABLE IF NOT EXISTS fleet_migrations (version integer PRIMARY KEY, "
                               "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
            # one `fleet init` at a time: a second waits here rather than apply a migration twice
            await conn.execute("LOCK TABLE fleet_migrations IN EXCLUSIVE MODE")
            have = {r[0] for r in await (await conn.execute("SELECT version FROM fleet_migrations")).fetchall()}
            for version, name, sql in migrations():
                if version in have:
                    continue
                await conn.execute(sql)
                await conn.execute("INSERT INTO fleet_migrations (version, name) VALUES (%s, %s)", (version, name))
                applied.append(name)
    return applied


async def add_host(dsn: str, host: str) -> str:
    """Creates `host`'s login role in flare_diag_host (row-level security lets it write only rows of
    `host`); returns the dsn line for its fleet file, without any password (the host's credential is
    its own: a passfile, a client certificate or peer authentication, as the site's pg_hba says)."""
    from psycopg import sql
    async with await connect(dsn, autocommit=True) as conn:
        exists = await (await conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (host,))).fetchone()
        if exists is None:
            await conn.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE flare_diag_host").format(sql.Identifier(host)))
        else:
            await conn.execute(sql.SQL("GRANT flare_diag_host TO {}").format(sql.Identifier(host)))
        dbname = conn.info.dbname
    return f'dsn = "{host_dsn(dsn, host, dbname)}"'


# the caller's own credentials and identity, never the host's: a host authenticates as itself
_CALLERS_OWN = ("user", "password", "passfile", "sslcert", "sslkey", "sslpassword", "service")


def host_dsn(dsn: str, host: str, dbname: str) -> str:
    """`dsn` as `host`'s role: every server it names (a multi-host DSN stays one, so the host finds a
    promoted standby as the caller would), its TLS and session settings, the caller's credentials gone."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    params = {k: v for k, v in conninfo_to_dict(dsn).items() if k not in _CALLERS_OWN}
    return make_conninfo("", **{**params, "dbname": params.get("dbname") or dbname, "user": host})
