"""flare-diagd with fleet settings, against a real PostgreSQL server and flaresim as processes: the lease
taken before anything changes and given back after a verified restore, refusals that leave the host
untouched, and shipping that never touches the window when the database goes away."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import psycopg
import pytest

from tests.daemontools import QUICK_LOAD_S, SCALE, Daemon, Sim, in_phase
from tests.pgtools import role_dsn


@pytest.fixture
def fleet_dsn(pg):
    import anyio

    from flare_diag.daemon.fleet.db import migrate
    dsn = pg.database()
    anyio.run(migrate, dsn)
    return dsn


@pytest.fixture
def sim(tmp_path):
    s = Sim(tmp_path, load_s=QUICK_LOAD_S)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def pool_plan(tmp_path_factory) -> Path:
    """A whole window (take-down, load, identity verified, restore, readmit) in about half a second at
    x100: the leases are the subject here."""
    from tests.daemontools import one_phase_plan
    return one_phase_plan(tmp_path_factory.mktemp("plan") / "pool-window.toml")


def _pool(dsn: str, k: int, pool: str = "pool-a") -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO pools (pool, max_down) VALUES (%s, %s)", (pool, k))


def _fleet_file(tmp: Path, dsn: str, host: str = "h1") -> Path:
    """The daemon's fleet file: it connects as the host's own login role (flare_diag_host), never as
    the superuser the test's own checks read with."""
    f = tmp / "fleet.toml"
    f.write_text(f'dsn = "{role_dsn(dsn, host)}"\nhost = "{host}"\npool = "pool-a"\nlease_timeout_s = 5\n')
    return f


def _operator(dsn: str) -> str:
    """The CLI's DSN: an operator's login role (flare_diag_operator)."""
    return role_dsn(dsn, "alice", "flare_diag_operator")


def _daemon(tmp: Path, dsn: str, *more: str) -> Daemon:
    return Daemon(tmp, args=("--fleet", str(_fleet_file(tmp, dsn)), *more)).start()


def _metrics(d: Daemon) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    addr = next(r["address"] for r in d.records() if r.get("event") == "metrics serving")
    text = httpx.get(f"http://{addr}/metrics", timeout=10).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def _start(d: Daemon, pool_plan: Path, sim: Sim, scale: float = SCALE):
    return d.cli("start", str(pool_plan), "--site", sim.site.stem, "--time-scale", str(scale), "--accept-partial")


def _started(d: Daemon, plan: Path, sim: Sim) -> str:
    """A window started on the daemon (as the CLI's `start`); its id."""
    p = _start(d, plan, sim)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1]


def _query(dsn: str, sql: str, args=()) -> list[tuple]:
    with psycopg.connect(dsn) as c:
        return c.execute(sql, args).fetchall()


def _local(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT seq, hash FROM events ORDER BY seq").fetchall()


def _wait(pred, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _shipped_all(dsn: str, db: Path) -> bool:
    central = [(s, bytes(h)) for s, h in _query(dsn, "SELECT seq, hash FROM events WHERE host = 'h1' ORDER BY seq")]
    return central == _local(db)


def test_a_window_takes_the_pools_lease_ships_every_event_and_gives_the_lease_back(tmp_path, fleet_dsn, sim, pool_plan):
    _pool(fleet_dsn, 1)
    d = _daemon(tmp_path, fleet_dsn, "--metrics-address", "127.0.0.1:0")
    try:
        p = _start(d, pool_plan, sim)
        assert p.returncode == 0, p.stderr
        window_id = p.stdout.strip().splitlines()[-1]
        assert _query(fleet_dsn, "SELECT host, window_id, state FROM leases") == [("h1", window_id, "held")]
        d.wait_for(lambda st: st["state"] == "idle" and st["last_window"], timeout=240, what="the window to close")
        _wait(lambda: not _query(fleet_dsn, "SELECT 1 FROM leases"), 30, "the lease to be released")
        _wait(lambda: _shipped_all(fleet_dsn, d.state / "log.db"), 30, "every event to be shipped")
        st = d.status()
        metrics = _wait(lambda: (m := _metrics(d))["flare_diag_fleet_lease_held"] == 0 and m, 30, "the metrics")
    finally:
        d.stop()
    log = _query(fleet_dsn, "SELECT change, window_id FROM lease_log ORDER BY id")
    assert log == [("taken", window_id), ("released", window_id)]
    assert st["fleet"]["lag_events"] == 0 and st["fleet"]["lease"] is None
    assert metrics["flare_diag_fleet_shipping_up"] == 1 and metrics["flare_diag_fleet_lag_events"] == 0
    assert _query(fleet_dsn, "SELECT restoration_verified FROM windows WHERE window_id = %s", (window_id,)) == [(True,)]


def test_a_start_on_a_full_pool_is_refused_with_exit_4_naming_the_holder_and_the_host_untouched(
        tmp_path, fleet_dsn, sim, pool_plan):
    _pool(fleet_dsn, 1)
    with psycopg.connect(fleet_dsn, autocommit=True) as c:
        c.execute("INSERT INTO leases (host, pool, window_id) VALUES ('h9', 'pool-a', 'w-other')")
    d = _daemon(tmp_path, fleet_dsn)
    try:
        p = _start(d, pool_plan, sim)
        loaded = sim.get("/manager/v1/state")
    finally:
        d.stop()
    assert p.returncode == 4 and "pool pool-a is full" in p.stderr and "h9 (window w-other" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert loaded["loaded"]["recipe"] == "glm-incumbent"
    assert not _query(fleet_dsn, "SELECT 1 FROM leases WHERE host = 'h1'")
    with sqlite3.connect(d.state / "log.db") as c:
        assert c.execute("SELECT COUNT(*) FROM events WHERE type = 'window_opened'").fetchone() == (0,)


def test_a_start_its_site_check_refuses_after_the_lease_gives_the_lease_back_and_the_host_untouched(
        tmp_path, fleet_dsn, sim, pool_plan):
    # the lease comes before the host's reads (a start that would lose the pool's last slot sends the
    # primary no probes); a site check that then refuses must not leave the slot taken
    _pool(fleet_dsn, 1)
    (tmp_path / "sim.token").write_text("0" * 32)  # not the simulator's token: every read of the host is refused
    d = _daemon(tmp_path, fleet_dsn)
    try:
        p = _start(d, pool_plan, sim)
        _wait(lambda: not _query(fleet_dsn, "SELECT 1 FROM leases"), 30, "the lease to be given back")
        loaded = sim.get("/manager/v1/state")
    finally:
        d.stop()
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    log = _query(fleet_dsn, "SELECT change, NULLIF(reason, '') FROM lease_log WHERE host = 'h1' ORDER BY id")
    assert log == [("taken", None), ("released", "the window never opened")]
    assert loaded["loaded"]["recipe"] == "glm-incumbent"
    with sqlite3.connect(d.state / "log.db") as c:
        assert c.execute("SELECT COUNT(*) FROM events WHERE type = 'window_opened'").fetchone() == (0,)


def test_a_start_with_the_fleet_database_unreachable_is_refused_and_changes_nothing(tmp_path, pg, sim, pool_plan):
    gone = pg.database_dsn("no_such_database")
    d = _daemon(tmp_path, gone)
    try:
        p = _start(d, pool_plan, sim)
        loaded = sim.get("/manager/v1/state")
    finally:
        d.stop()
    assert p.returncode == 2 and "no fleet lease for pool pool-a" in p.stderr and "cannot connect" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "password" not in p.stderr
    assert loaded["loaded"]["recipe"] == "glm-incumbent"


def test_the_database_stopped_immediately_mid_window_leaves_the_window_whole_and_the_backlog_ships_after(
        tmp_path, pg, fleet_dsn, sim, pool_plan):
    _pool(fleet_dsn, 1)
    d = _daemon(tmp_path, fleet_dsn)
    try:
        window_id = _started(d, pool_plan, sim)
        pg.stop("immediate")  # the lease is held and the window runs: from here on nothing reaches the database
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
            while True:
                last = stop.is_set()  # set once the release was seen: the read after it sees it too
                seen.append(c.execute("SELECT COUNT(*) FROM leases WHERE pool = 'pool-a'").fetchone()[0])
                if last:
                    return
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


def _control_start(d: Daemon, plan: Path, site: str, scale: float) -> dict:
    """`start` over the control socket itself, as a script would (the CLI is one client of it): twelve
    operators retrying through a CLI process each would spend the machine on interpreters."""
    import json
    import socket
    cmd = {"cmd": "start", "plan_toml": plan.read_text(), "site": site, "plan_label": str(plan), "time_scale": scale,
           "accept_partial": True}
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(120)
        s.connect(str(d.socket))
        s.sendall(json.dumps(cmd).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n") and (chunk := s.recv(65536)):
            buf += chunk
    return json.loads(buf)


# The pool's windows are about leases, not timings: each closes in about half a real second. Not
# faster: on a busy machine an action's real latency (tens of milliseconds) is window time, and the
# watchers poll every 5 window seconds of it. At x400 the twelve-daemon test's windows were longer
# in window time, polled more, and the pool and campaign tests took 22.1 s of CPU; 18.6 at x100.
POOL_SCALE = SCALE


def _intervals(dsn: str) -> list[tuple[str, int, int]]:
    """(host, quiesce answered, readmit answered) of every window, from the fleet's events alone."""
    import flare_diag.events.schema  # noqa: F401
    from flare_diag.events.base import decode_payload
    rows = _query(dsn, "SELECT host, seq, type, schema_v, wall_ns, payload FROM events WHERE type IN "
                       "('action_requested', 'action_done') ORDER BY host, seq")
    asked: dict[tuple[str, int], str] = {}
    out, down = [], {}
    for host, _seq, type_, v, wall, payload in rows:
        ev = decode_payload(type_, v, bytes(payload))
        if type_ == "action_requested" and ev.action in ("quiesce", "readmit"):
            asked[(host, ev.action_id)] = ev.action
        elif type_ == "action_done" and ev.ok and (host, ev.action_id) in asked:
            if asked[(host, ev.action_id)] == "quiesce":
                down[host] = wall
            else:
                out.append((host, down.pop(host), wall))
    assert not down, f"quiesced and never readmitted: {down}"
    return out


def test_twelve_daemons_in_a_pool_of_max_down_two_never_have_more_than_two_primaries_out(tmp_path, fleet_dsn, pool_plan):
    import threading
    hosts, windows_each = 12, 3
    _pool(fleet_dsn, 2)
    plan = pool_plan
    sims, daemons, errors = [], [], []
    try:
        from concurrent.futures import ThreadPoolExecutor
        folders = [tmp_path / f"h{i:02d}" for i in range(hosts)]
        for f in folders:
            f.mkdir()
        with ThreadPoolExecutor(hosts) as pool:  # twelve simulators start side by side
            sims.extend(pool.map(lambda f: Sim(f, time_scale=POOL_SCALE, load_s=QUICK_LOAD_S), folders))
        for i, f in enumerate(folders):
            daemons.append(Daemon(f, args=("--fleet", str(_fleet_file(f, fleet_dsn, f"h{i:02d}")))).start(wait=False))
        for d in daemons:
            d.wait_ready(120)
            d.review(plan)  # each daemon records the plan's review in its own log before its starts
        go = threading.Barrier(hosts)

        def operator(d: Daemon, sim: Sim) -> None:
            try:
                # one connection each, polled often: a slot left free while operators reconnect is
                # time the test waits for nothing
                with psycopg.connect(fleet_dsn, autocommit=True) as db:
                    go.wait()
                    for _ in range(windows_each):
                        while True:  # a full pool refuses (`busy`, exit 4 in the CLI): again once a slot frees
                            reply = _control_start(d, plan, sim.site.stem, POOL_SCALE)
                            if reply["ok"]:
                                break
                            assert reply.get("code") == "busy" and "is full" in reply["error"], reply
                            _wait(lambda: db.execute("SELECT COUNT(*) FROM leases").fetchone()[0] < 2, 300, "a free slot",
                                  every=0.05)
                        wid = reply["window_id"]
                        # the daemon's own journal says when the window is over (no CLI process per poll)
                        _wait(lambda wid=wid: any(r.get("event") == "report published" and r.get("window_id") == wid
                                          for r in d.records()), 300, f"window {wid} to close", every=0.1)
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                errors.append(exc)

        threads = [threading.Thread(target=operator, args=(d, s)) for d, s in zip(daemons, sims)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        _wait(lambda: not _query(fleet_dsn, "SELECT 1 FROM leases"), 60, "every lease to be released")
        _wait(lambda: all(_shipped_all_for(fleet_dsn, f"h{i:02d}", d.state / "log.db") for i, d in enumerate(daemons)),
              60, "every event to be shipped")
    finally:
        for d in daemons:
            d.stop()
        for s in sims:
            s.stop()
    spans = _intervals(fleet_dsn)
    edges = sorted([(t0, 1) for _h, t0, _t1 in spans] + [(t1, -1) for _h, _t0, t1 in spans], key=lambda e: (e[0], e[1]))
    out = peak = 0
    for _t, step in edges:
        out += step
        peak = max(peak, out)
    assert len(spans) == hosts * windows_each and peak <= 2
    verified = _query(fleet_dsn, "SELECT COUNT(*), COUNT(*) FILTER (WHERE restoration_verified) FROM windows")
    changes = _query(fleet_dsn, "SELECT change, COUNT(*) FROM lease_log GROUP BY change ORDER BY change")
    assert verified == [(hosts * windows_each, hosts * windows_each)]
    assert changes == [("released", hosts * windows_each), ("taken", hosts * windows_each)]


def _shipped_all_for(dsn: str, host: str, db: Path) -> bool:
    central = [(s, bytes(h)) for s, h in _query(dsn, "SELECT seq, hash FROM events WHERE host = %s ORDER BY seq", (host,))]
    return central == _local(db)


def _done_runs(dsn: str, campaign: str) -> int:
    """The campaign's runs marked done, read from the database: polled here rather than through a CLI
    process each time (`fleet campaign show` is run once, on the answer)."""
    return _query(dsn, "SELECT COUNT(*) FROM runs WHERE campaign = %s AND state = 'done'", (int(campaign),))[0][0]


def test_a_campaign_of_two_hosts_runs_every_run_through_a_pool_of_one_requeueing_the_one_refused(tmp_path, fleet_dsn, pool_plan):
    import json
    import subprocess
    import sys

    from tests.daemontools import ROOT
    _pool(fleet_dsn, 1)
    plan = pool_plan
    sims, daemons = [], []
    try:
        for h in ("c1", "c2"):
            d_tmp = tmp_path / h
            d_tmp.mkdir()
            sims.append(Sim(d_tmp, time_scale=POOL_SCALE, load_s=QUICK_LOAD_S))
            daemons.append(Daemon(d_tmp, args=("--fleet", str(_fleet_file(d_tmp, fleet_dsn, h)))).start())
        fleet = [sys.executable, "-m", "flare_diag.daemon.cli", "fleet", "campaign"]
        for d in daemons:  # each host's daemon starts its runs only with the plan's review in its own log
            d.review(plan)
        with psycopg.connect(fleet_dsn, autocommit=True) as c:  # another primary holds the pool's one slot
            c.execute("INSERT INTO leases (host, pool, window_id) VALUES ('h9', 'pool-a', 'w-other')")
        p = subprocess.run([*fleet, "create", "--plan", str(plan), "--site", "site", "--hosts", "c1,c2", "--repeats", "1",
                            "--time-scale", str(POOL_SCALE), "--accept-partial", "--dsn", _operator(fleet_dsn)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        campaign = p.stdout.split()[1].rstrip(":")

        def shown() -> dict:
            q = subprocess.run([*fleet, "show", campaign, "--json", "--dsn", _operator(fleet_dsn)], cwd=ROOT, capture_output=True,
                               text=True, timeout=60)
            assert q.returncode == 0, q.stderr
            return json.loads(q.stdout)

        _wait(lambda: any(r.get("event") == "campaign run requeued" and r.get("why") == "busy"
                          for d in daemons for r in d.records()),
              60, "a run refused on the full pool and requeued")
        with psycopg.connect(fleet_dsn, autocommit=True) as c:  # the other primary is back: its slot frees
            c.execute("DELETE FROM leases WHERE host = 'h9'")
        _wait(lambda: _done_runs(fleet_dsn, campaign) == 2, 300, "every run to be done")
        done = shown()
        loaded = [s.get("/manager/v1/state")["loaded"]["recipe"] for s in sims]
    finally:
        for d in daemons:
            d.stop()
        for s in sims:
            s.stop()
    assert done["summary"]["restorations_verified"] == 2 and loaded == ["glm-incumbent", "glm-incumbent"]
    assert sorted(r["host"] for r in done["runs"]) == ["c1", "c2"] and len({r["window_id"] for r in done["runs"]}) == 2
    assert _query(fleet_dsn, "SELECT COUNT(*) FROM lease_log WHERE change = 'taken'") == [(2,)]


def test_a_campaign_run_whose_window_the_database_never_heard_of_is_marked_from_the_log_not_run_twice(
        tmp_path, fleet_dsn, pool_plan):
    """The database lost the run's "running" mark (a failover between the start and the mark) and the
    claim then expired back to the queue: the host's log names the run's window (campaign_run_started),
    so the daemon marks the run done under it instead of starting the plan a second time."""
    import subprocess
    import sys

    from tests.daemontools import ROOT
    _pool(fleet_dsn, 1)
    sim = Sim(tmp_path, time_scale=POOL_SCALE, load_s=QUICK_LOAD_S)
    d = Daemon(tmp_path, args=("--fleet", str(_fleet_file(tmp_path, fleet_dsn, "r1")))).start()
    try:
        d.review(pool_plan)
        p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "fleet", "campaign", "create", "--plan",
                            str(pool_plan), "--site", "site", "--hosts", "r1", "--time-scale", str(POOL_SCALE),
                            "--accept-partial", "--dsn", _operator(fleet_dsn)], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        campaign = int(p.stdout.split()[1].rstrip(":"))
        _wait(lambda: _done_runs(fleet_dsn, campaign) == 1, 300, "the run to be done")
        [(window_id,)] = _query(fleet_dsn, "SELECT window_id FROM runs WHERE campaign = %s", (campaign,))
        with psycopg.connect(fleet_dsn, autocommit=True) as c:  # what the database would hold had it lost the mark
            c.execute("UPDATE runs SET state = 'queued', window_id = NULL, outcome = NULL, finished_at = NULL "
                      "WHERE campaign = %s", (campaign,))
            c.execute("NOTIFY flare_diag_runs")
        _wait(lambda: _done_runs(fleet_dsn, campaign) == 1, 120, "the run to be marked done again, from the log")
        started = [r for r in d.records() if r.get("event") == "window started"]
    finally:
        d.stop()
        sim.stop()
    assert _query(fleet_dsn, "SELECT window_id, attempts FROM runs WHERE campaign = %s", (campaign,)) == [(window_id, 1)]
    assert len(started) == 1, started


def test_a_follow_on_campaign_runs_its_sides_in_the_plans_order_and_applies_the_acceptance_rule(tmp_path, fleet_dsn):
    import json
    import subprocess
    import sys

    from tests.daemontools import PLAN, ROOT
    _pool(fleet_dsn, 1)
    text = PLAN.read_text()
    head, _, rest = text.partition("[[phases]]")
    phases = rest.split("[[phases]]")
    plan = tmp_path / "follow-on.toml"  # identity and a prime on the eight-body set, as a one-repeat follow-on
    plan.write_text(head.replace('name = "2026-10-22-cache-diagnosis"', 'name = "follow-on"')
                    + "[[phases]]" + phases[0] + "[[phases]]" + phases[1].split("[trace]")[0]
                    + rest[rest.index("[[conditional]]"):]
                    + '\n[follow_on]\nstage = "policy"\nsource_window = "w0"\nsource_plan_sha256 = "x"\n'
                      'verdict = "row_checkpoint_churn"\npolicy = "marconi"\norder = ["baseline", "candidate"]\n'
                      'repeats = 1\nmin_benefit = 0.2\n')
    plan.write_text(plan.read_text().replace('fixture = "c1-52"', 'fixture = "tok1024"'))
    sim = Sim(tmp_path, time_scale=POOL_SCALE, load_s=QUICK_LOAD_S)
    (tmp_path / "site-policy.toml").write_text(sim.site.read_text())  # the policy's build: here the same recipe
    d = Daemon(tmp_path, args=("--fleet", str(_fleet_file(tmp_path, fleet_dsn, "f1")))).start()
    d.review(plan)
    fleet = [sys.executable, "-m", "flare_diag.daemon.cli", "fleet", "campaign"]
    try:
        p = subprocess.run([*fleet, "create", "--plan", str(plan), "--site", "site", "--candidate-site", "site-policy",
                            "--hosts", "f1", "--time-scale", str(POOL_SCALE), "--accept-partial", "--dsn", _operator(fleet_dsn)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        campaign = p.stdout.split()[1].rstrip(":")

        def shown() -> dict:
            q = subprocess.run([*fleet, "show", campaign, "--json", "--dsn", _operator(fleet_dsn)], cwd=ROOT,
                               capture_output=True, text=True, timeout=120)
            assert q.returncode == 0, q.stderr
            return json.loads(q.stdout)

        _wait(lambda: _done_runs(fleet_dsn, campaign) == 2, 300, "both runs to be done")
        done = shown()
    finally:
        d.stop()
        sim.stop()
    assert [(r["repeat"], r["side"]) for r in done["runs"]] == [(1, "baseline"), (2, "candidate")]
    assert [r.get("site") for r in d.records() if r.get("event") == "window started"] == ["site", "site-policy"]
    # both sides run the same build on the wall clock: the rule's answer is noise, so what is held is that
    # it ran on the two measured repeats (a benefit computed, a reason given), not which way it went
    verdict = done["acceptance"]["f1"]
    assert verdict["reason"].startswith(("accepted", "not accepted")) and verdict["primary_benefit"] is not None
    assert verdict["bar"] == {"min_benefit": 0.2, "max_regression": 0.03}  # the plan's, stricter than the seed's


def test_a_window_whose_lease_is_freed_under_it_aborts_and_restores(tmp_path, fleet_dsn, sim, small_plan):
    """The daemon re-asserts its running window's lease (host, window, epoch): freed by hand while the
    window runs, the primary would be out without its pool's slot, so the window aborts and restores."""
    from flare_diag.events.reader import LogReader
    _pool(fleet_dsn, 1)
    d = _daemon(tmp_path, fleet_dsn)
    try:
        window_id = _started(d, small_plan, sim)
        d.wait_for(lambda st: in_phase(st, 2), timeout=120, what="a phase with requests")
        with psycopg.connect(_operator(fleet_dsn)) as c:
            c.execute("DELETE FROM leases WHERE host = 'h1'")
        st = d.wait_for(lambda s: s["state"] == "idle" and s["last_window"], timeout=240, what="the restore")
    finally:
        d.stop()
    last = st["last_window"]
    assert last["window_id"] == window_id and last["outcome"] == "aborted", last
    with LogReader(d.state / "log.db") as reader:
        events = [e.event() for e in reader.iter() if e.window_id == window_id]
    granted = [e for e in events if type(e).__name__ == "LeaseGranted"]
    aborted = [e for e in events if type(e).__name__ == "AbortDecided"]
    assert len(granted) == 1 and granted[0].epoch >= 1 and granted[0].pool == "pool-a"
    assert aborted and aborted[0].reason == "operator" and "fleet lease" in aborted[0].detail
    assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-incumbent"


def test_a_standby_promoted_mid_window_takes_the_daemon_over_and_the_lease_is_never_doubled(tmp_path, sim, small_plan):
    """A streaming-replication standby (pg_basebackup -R, synchronous), promoted while a window runs; the
    daemon's DSN names both servers with target_session_attrs=read-write, so it finds the new primary,
    re-asserts its lease there (replicated synchronously) and releases it once the window restores."""
    import anyio

    from flare_diag.daemon.fleet.db import migrate
    from tests.pgtools import PgServer
    primary = PgServer()
    standby = primary.standby(synchronous=True)
    try:
        dsn = primary.database()
        anyio.run(migrate, dsn)
        _pool(dsn, 1)
        role_dsn(dsn, "h1")
        name = dsn.split("dbname=")[1].split()[0]
        both = (f"host={primary.sock},{standby.sock} port=5432,5432 dbname={name} user=h1 "
                f"target_session_attrs=read-write connect_timeout=2")
        f = tmp_path / "fleet.toml"
        f.write_text(f'dsn = "{both}"\nhost = "h1"\npool = "pool-a"\nlease_timeout_s = 5\n')
        d = Daemon(tmp_path, args=("--fleet", str(f))).start()
        try:
            p = _start(d, small_plan, sim)
            assert p.returncode == 0, p.stderr
            window_id = p.stdout.strip().splitlines()[-1]
            d.wait_for(lambda st: in_phase(st, 2), timeout=120, what="a phase with requests")
            primary.stop("immediate")  # the fleet database's primary is lost mid-window
            standby.promote()
            new = standby.database_dsn(name)
            # the lease the window runs under is on the new primary: the grant was synchronous
            assert _query(new, "SELECT host, window_id FROM leases") == [("h1", window_id)]
            st = d.wait_for(lambda s: s["state"] == "idle" and s["last_window"], timeout=240, what="the window to close")
            _wait(lambda: not _query(new, "SELECT 1 FROM leases"), 60, "the lease to be released on the new primary")
            _wait(lambda: _shipped_all(new, d.state / "log.db"), 60, "every event to be shipped to the new primary")
        finally:
            d.stop()
        assert st["last_window"]["window_id"] == window_id and st["last_window"]["outcome"] in ("completed", "partial")
        assert _query(new, "SELECT change, window_id FROM lease_log ORDER BY id") == [("taken", window_id),
                                                                                    ("released", window_id)]
    finally:
        standby.remove()
        primary.remove()
