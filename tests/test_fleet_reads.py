"""`fleet status` and `fleet windows` through libpq itself (issue 49's start-up): the same documents as
through psycopg, the same connection strings, one line when the database is not there, and psycopg never
imported."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict as psycopg_parse

from flare_diag.daemon.fleet import lease, libpq
from flare_diag.daemon.fleet.dsn import FleetError
from flare_diag.daemon.fleet.db import migrate
from flare_diag.daemon.fleet.shipper import ship_once
from flare_diag.daemon.fleet.reads import status, status_now, windows, windows_now
from tests.pgtools import role_dsn

CORPUS = Path(__file__).parent / "data" / "replay"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def fleet(pg, tmp_path) -> str:
    """A fleet with two pools, a host that shipped a log and holds a lease, one that did neither, and an alarm."""
    dsn = pg.database()
    await migrate(dsn)
    db = tmp_path / "h1.db"
    db.write_bytes(gzip.decompress((CORPUS / "completed-default.db.gz").read_bytes()))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as su:
        await su.execute("INSERT INTO pools (pool, max_down) VALUES ('pool-a', 2), ('pool-b', 1)")
        await su.execute("INSERT INTO alarms (host, kind, detail) VALUES ('h2', 'fork', 'seq 7 differs')")
    async with await psycopg.AsyncConnection.connect(role_dsn(dsn, "h1")) as h1:
        while (await ship_once(h1, "h1", "pool-a", db, 500)).events:
            pass
        await lease.take(h1, "pool-a", "h1", "w-1", "flare-diagd")
    return role_dsn(dsn, "alice", "flare_diag_operator")


def test_status_through_libpq_is_the_document_psycopg_reads(fleet):
    import anyio
    assert libpq.library() is not None
    assert status_now(fleet) == anyio.run(status, fleet)


async def test_status_says_who_is_down_and_each_hosts_head_and_lease(fleet):
    st = await status(fleet)
    pools = {p["pool"]: p for p in st["pools"]}
    assert (pools["pool-a"]["down"], pools["pool-a"]["max_down"], pools["pool-b"]["down"]) == (1, 2, 0)
    assert [(h["host"], h["window_id"], h["state"]) for h in pools["pool-a"]["held_by"]] == [("h1", "w-1", "held")]
    (h1,) = st["hosts"]
    assert h1["lease"] == {"window_id": "w-1", "state": "held"} and h1["head_seq"] > 100 and len(h1["head_hash"]) == 64
    assert [(a["host"], a["kind"], a["detail"]) for a in st["alarms"]] == [("h2", "fork", "seq 7 differs")]


async def test_status_timestamps_read_as_psycopg_writes_a_datetime(fleet):
    # PostgreSQL's own JSON would write .773640 as .77364: one in ten of them
    async with await psycopg.AsyncConnection.connect(fleet) as conn:
        last, shipped = await (await conn.execute("SELECT last_event_at, shipped_at FROM hosts")).fetchone()
        (at,) = await (await conn.execute("SELECT at FROM alarms")).fetchone()
    st = status_now(fleet)
    assert (st["hosts"][0]["last_event_at"], st["hosts"][0]["shipped_at"], st["alarms"][0]["at"]) == \
        tuple(t.isoformat(timespec="microseconds") for t in (last, shipped, at))


def test_a_database_that_is_not_there_is_one_line_naming_it_without_the_password():
    dsn = libpq.make_conninfo("host=127.0.0.1 port=1 dbname=fleet user=alice", password="s3cret")
    with pytest.raises(FleetError) as err:
        status_now(dsn)
    msg = str(err.value)
    assert msg.startswith("fleet database host=127.0.0.1 port=1 dbname=fleet user=alice: cannot connect (")
    assert "s3cret" not in msg and "\n" not in msg


@pytest.mark.parametrize(("argv", "says"), [
    (["fleet", "status"], "pool pool-a: 1 of 2 down: h1 (w-1, held)"),
    (["fleet", "windows", "--host", "h1"], "  h1  "),
])
def test_the_fleets_reads_never_import_psycopg_or_the_event_loop(fleet, argv, says):
    probe = ("import sys; from flare_diag.daemon.cli.commands import main; rc = main(sys.argv[1:]); "
             "assert 'psycopg' not in sys.modules, 'psycopg imported'; "
             "assert 'asyncio' not in sys.modules, 'asyncio imported'; sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", probe, *argv, "--dsn", fleet], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert says in p.stdout


@pytest.mark.parametrize("asked", [{}, {"host": "h1"}, {"host": "h9"}, {"verdict": "not_reproduced"},
                                   {"since": "2000-01-01"}, {"since": "2999-01-01T00:00+00:00"}, {"limit": 0}])
def test_windows_through_libpq_are_the_rows_psycopg_reads(fleet, asked):
    import anyio
    assert windows_now(fleet, **asked) == anyio.run(lambda: windows(fleet, **asked))


async def test_windows_are_the_shipped_ones_newest_first_with_their_outcome_and_restoration(fleet):
    got = await windows(fleet)
    assert got and all(w["host"] == "h1" and w["pool"] == "pool-a" for w in got)
    assert [w["opened_at"] for w in got] == sorted((w["opened_at"] for w in got), reverse=True)
    assert {(w["outcome"], w["restoration_verified"]) for w in got} == {("completed", True)}
    assert await windows(fleet, since="2999-01-01") == [] and await windows(fleet, host="h9") == []


_VALUE = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
_KEYS = st.sampled_from(["host", "port", "dbname", "user", "options", "application_name", "sslmode",
                         "target_session_attrs", "connect_timeout", "passfile"])


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_KEYS, _VALUE, max_size=5), st.dictionaries(_KEYS, _VALUE, max_size=3))
def test_a_conninfo_made_here_parses_to_what_was_asked_as_psycopg_parses_it(base, extra):
    dsn = libpq.make_conninfo("", **base) if base else ""
    made = libpq.make_conninfo(dsn, **extra) if extra else dsn
    assert libpq.conninfo_to_dict(made) == {**base, **extra} == {k: str(v) for k, v in psycopg_parse(made).items()}


@settings(max_examples=300)
@given(st.text(max_size=40).filter(lambda s: "\x00" not in s))
def test_any_connection_string_parses_here_exactly_when_psycopg_parses_it(dsn):
    try:
        want = {k: str(v) for k, v in psycopg_parse(dsn).items()}
    except psycopg.ProgrammingError:
        with pytest.raises(libpq.LibpqError):
            libpq.conninfo_to_dict(dsn)
        return
    assert libpq.conninfo_to_dict(dsn) == want
