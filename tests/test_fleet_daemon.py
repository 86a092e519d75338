"""flare-diagd with fleet settings, against a real PostgreSQL server and flaresim as processes: the lease
taken before anything changes and given back after a verified restore, refusals that leave the host
untouched, and shipping that never touches the window when the database goes away."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import psycopg
import pytest

from tests.daemontools import SCALE, Daemon, Sim, in_phase
from tests.pgtools import PgServer


@pytest.fixture(scope="module")
def pg():
    server = PgServer()
    yield server
    server.remove()


@pytest.fixture
def fleet_dsn(pg):
    import anyio

    from flare_diag.daemon.fleet.db import migrate
    dsn = pg.database()
    anyio.run(migrate, dsn)
    return dsn


@pytest.fixture
def sim(tmp_path):
    s = Sim(tmp_path)
    yield s
    s.stop()


def _pool(dsn: str, k: int, pool: str = "pool-a") -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO pools (pool, max_down) VALUES (%s, %s)", (pool, k))


def _fleet_file(tmp: Path, dsn: str, host: str = "h1") -> Path:
    f = tmp / "fleet.toml"
    f.write_text(f'dsn = "{dsn}"\nhost = "{host}"\npool = "pool-a"\nlease_timeout_s = 5\n')
    return f


def _daemon(tmp: Path, dsn: str) -> Daemon:
    return Daemon(tmp, args=("--fleet", str(_fleet_file(tmp, dsn)))).start()


def _start(d: Daemon, small_plan: Path, sim: Sim):
    return d.cli("start", str(small_plan), "--site", sim.site.stem, "--time-scale", str(SCALE), "--accept-partial")


def _query(dsn: str, sql: str, args=()) -> list[tuple]:
    with psycopg.connect(dsn) as c:
        return c.execute(sql, args).fetchall()


def _local(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT seq, hash FROM events ORDER BY seq").fetchall()


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _shipped_all(dsn: str, db: Path) -> bool:
    central = [(s, bytes(h)) for s, h in _query(dsn, "SELECT seq, hash FROM events WHERE host = 'h1' ORDER BY seq")]
    return central == _local(db)


def test_a_window_takes_the_pools_lease_ships_every_event_and_gives_the_lease_back(tmp_path, fleet_dsn, sim, small_plan):
    _pool(fleet_dsn, 1)
    d = _daemon(tmp_path, fleet_dsn)
    try:
        p = _start(d, small_plan, sim)
        assert p.returncode == 0, p.stderr
        window_id = p.stdout.strip().splitlines()[-1]
        assert _query(fleet_dsn, "SELECT host, window_id, state FROM leases") == [("h1", window_id, "held")]
        d.wait_for(lambda st: st["state"] == "idle" and st["last_window"], timeout=240, what="the window to close")
        _wait(lambda: not _query(fleet_dsn, "SELECT 1 FROM leases"), 30, "the lease to be released")
        _wait(lambda: _shipped_all(fleet_dsn, d.state / "log.db"), 30, "every event to be shipped")
        st = d.status()
    finally:
        d.stop()
    log = _query(fleet_dsn, "SELECT change, window_id FROM lease_log ORDER BY id")
    assert log == [("taken", window_id), ("released", window_id)]
    assert st["fleet"]["lag_events"] == 0 and st["fleet"]["lease"] is None
    assert _query(fleet_dsn, "SELECT restoration_verified FROM windows WHERE window_id = %s", (window_id,)) == [(True,)]


def test_a_start_on_a_full_pool_is_refused_with_exit_4_naming_the_holder_and_the_host_untouched(
        tmp_path, fleet_dsn, sim, small_plan):
    _pool(fleet_dsn, 1)
    with psycopg.connect(fleet_dsn, autocommit=True) as c:
        c.execute("INSERT INTO leases (host, pool, window_id) VALUES ('h9', 'pool-a', 'w-other')")
    d = _daemon(tmp_path, fleet_dsn)
    try:
        p = _start(d, small_plan, sim)
        loaded = sim.get("/manager/v1/state")
    finally:
        d.stop()
    assert p.returncode == 4 and "pool pool-a is full" in p.stderr and "h9 (window w-other" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert loaded["loaded"]["recipe"] == "glm-incumbent"
    assert not _query(fleet_dsn, "SELECT 1 FROM leases WHERE host = 'h1'")
    with sqlite3.connect(d.state / "log.db") as c:
        assert c.execute("SELECT COUNT(*) FROM events WHERE type = 'window_opened'").fetchone() == (0,)


def test_a_start_with_the_fleet_database_unreachable_is_refused_and_changes_nothing(tmp_path, pg, sim, small_plan):
    gone = pg.database_dsn("no_such_database")
    d = _daemon(tmp_path, gone)
    try:
        p = _start(d, small_plan, sim)
        loaded = sim.get("/manager/v1/state")
    finally:
        d.stop()
    assert p.returncode == 2 and "no fleet lease for pool pool-a" in p.stderr and "cannot connect" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "password" not in p.stderr
    assert loaded["loaded"]["recipe"] == "glm-incumbent"


def test_the_database_stopped_immediately_mid_window_leaves_the_window_whole_and_the_backlog_ships_after(
        tmp_path, pg, fleet_dsn, sim, small_plan):
    _pool(fleet_dsn, 1)
    d = _daemon(tmp_path, fleet_dsn)
    try:
        p = _start(d, small_plan, sim)
        assert p.returncode == 0, p.stderr
        window_id = p.stdout.strip().splitlines()[-1]
        d.wait_for(lambda st: in_phase(st, 2), timeout=120, what="a phase with requests")
        pg.stop("immediate")
        try:
            st = d.wait_for(lambda st: st["state"] == "idle" and st["last_window"], timeout=240, what="the window to close")
            behind = d.status()["fleet"]
        finally:
            pg.start()
        _wait(lambda: _shipped_all(fleet_dsn, d.state / "log.db"), 60, "the backlog to ship")
        _wait(lambda: not _query(fleet_dsn, "SELECT 1 FROM leases"), 30, "the lease to be released")
        report = d.cli("report", window_id, "--format", "json")
    finally:
        d.stop()
    import json
    r = json.loads(report.stdout)
    assert st["last_window"]["outcome"] in ("completed", "partial") and r["restoration"]["verified"]
    assert behind["lag_events"] > 0 and behind["error"]
    assert not [rec for rec in d.records() if rec.get("event") == "window aborted and restored"]


def test_a_daemon_killed_mid_window_keeps_its_lease_restores_after_restart_and_only_then_releases_it(
        tmp_path, fleet_dsn, sim, small_plan):
    import signal
    import threading
    _pool(fleet_dsn, 1)
    d = _daemon(tmp_path, fleet_dsn)
    seen: list[int] = []
    stop = threading.Event()

    def watch_the_slot() -> None:  # what `fleet status` would show, every 50 ms, until the release
        with psycopg.connect(fleet_dsn, autocommit=True) as c:
            while not stop.is_set():
                seen.append(c.execute("SELECT COUNT(*) FROM leases WHERE pool = 'pool-a'").fetchone()[0])
                time.sleep(0.05)

    try:
        p = _start(d, small_plan, sim)
        assert p.returncode == 0, p.stderr
        window_id = p.stdout.strip().splitlines()[-1]
        d.wait_for(lambda st: in_phase(st, 2), timeout=120, what="a phase with requests")
        t = threading.Thread(target=watch_the_slot)
        t.start()
        d.kill(signal.SIGKILL)
        held_while_down = _query(fleet_dsn, "SELECT host, window_id FROM leases")
        d.start()
        st = d.wait_for(lambda s: s["state"] == "idle" and s["last_window"], timeout=240, what="the restore")
        _wait(lambda: not _query(fleet_dsn, "SELECT 1 FROM leases"), 30, "the lease to be released")
        stop.set()
        t.join()
    finally:
        stop.set()
        d.stop()
    assert held_while_down == [("h1", window_id)]
    assert st["last_window"]["window_id"] == window_id and sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-incumbent"
    first_free = seen.index(0)
    assert first_free > 0 and all(n == 1 for n in seen[:first_free]) and all(n == 0 for n in seen[first_free:])
    assert _query(fleet_dsn, "SELECT change FROM lease_log ORDER BY id") == [("taken",), ("released",)]
