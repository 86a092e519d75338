"""The fleet against a real PostgreSQL server: migrations, shipping in order with COPY, forks refused
on both sides, the anchor outside the host, and pool leases decided by row locks."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import anyio
import psycopg
import pytest

from flare_diag.daemon.fleet import lease
from flare_diag.daemon.fleet.db import migrate
from flare_diag.daemon.fleet.shipper import Fork, ship_once
from flare_diag.daemon.fleet.views import verify_host
from tests.pgtools import role_dsn

CORPUS = Path(__file__).parent / "data" / "replay"


@pytest.fixture
async def fleet(pg) -> str:
    dsn = pg.database()
    await migrate(dsn)
    return dsn


def _log(tmp_path: Path, name: str = "completed-default") -> Path:
    db = tmp_path / f"{name}.db"
    with gzip.open(CORPUS / f"{name}.db.gz", "rb") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return db


def _local(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT seq, hash, payload FROM events ORDER BY seq").fetchall()


async def _ship_all(dsn: str, host: str, db: Path, batch: int = 500) -> int:
    """Ships the whole log as `host`'s own login role does (flare_diag_host), never as the superuser."""
    async with await psycopg.AsyncConnection.connect(role_dsn(dsn, host)) as conn:
        n = 0
        while (res := await ship_once(conn, host, "pool-a", db, batch)).events:
            n += res.events
        return n


async def _central(dsn: str, host: str) -> list[tuple]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        rows = await (await conn.execute("SELECT seq, hash, payload FROM events WHERE host = %s ORDER BY seq",
                                         (host,))).fetchall()
        return [(s, bytes(h), bytes(p)) for s, h, p in rows]


async def test_init_applies_each_migration_once(pg):
    dsn = pg.database()
    first = await migrate(dsn)
    again = await migrate(dsn)
    assert first == ["001_init.sql", "002_campaigns.sql", "003_views.sql", "004_leases_bound_to_windows.sql",
                     "005_campaign_visibility.sql"]
    assert again == []


async def test_a_shipped_log_equals_the_local_one_hash_by_hash(fleet, tmp_path):
    db = _log(tmp_path)
    n = await _ship_all(fleet, "h1", db)
    assert n == len(_local(db)) and await _central(fleet, "h1") == _local(db)


async def test_shipping_again_sends_nothing_twice(fleet, tmp_path):
    db = _log(tmp_path)
    await _ship_all(fleet, "h1", db)
    assert await _ship_all(fleet, "h1", db) == 0
    assert len(await _central(fleet, "h1")) == len(_local(db))


async def test_the_fleet_lists_the_shipped_window_with_its_outcome_and_verdict(fleet, tmp_path):
    db = _log(tmp_path, "restore-path")
    await _ship_all(fleet, "h1", db)
    async with await psycopg.AsyncConnection.connect(fleet) as conn:
        rows = await (await conn.execute("SELECT outcome, verdict, restoration_verified FROM windows WHERE host = 'h1'")).fetchall()
    assert rows == [("completed", "restore_path", True)]


async def test_two_windows_shipped_in_one_batch_are_both_listed_with_their_outcome_and_last_seq(fleet, tmp_path):
    from tests.logtools import write_window
    db = tmp_path / "two.db"
    await write_window(db, window_id="w-a")
    await write_window(db, window_id="w-b")
    with sqlite3.connect(db) as c:
        local = dict(c.execute("SELECT window_id, MAX(seq) FROM events GROUP BY window_id").fetchall())
    async with await psycopg.AsyncConnection.connect(fleet) as conn:
        assert (await ship_once(conn, "h1", "pool-a", db, batch=10**6)).events == len(_local(db))
        rows = await (await conn.execute("SELECT window_id, outcome IS NOT NULL, opened_at < closed_at, last_seq "
                                         "FROM windows WHERE host = 'h1' ORDER BY window_id")).fetchall()
    assert rows == [("w-a", True, True, local["w-a"]), ("w-b", True, True, local["w-b"])]


async def test_central_events_refuse_update_and_delete(fleet, tmp_path):
    await _ship_all(fleet, "h1", _log(tmp_path))
    async with await psycopg.AsyncConnection.connect(fleet, autocommit=True) as conn:
        for sql in ("UPDATE events SET payload = 'x' WHERE seq = 1", "DELETE FROM events WHERE seq = 1",
                    "TRUNCATE events"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                await conn.execute(sql)


def _rewrite(db: Path, from_seq: int) -> None:
    """Rewrites the local log from `from_seq` with a recomputed chain, as a forger with the file would."""
    from flare_diag.events.chain import GENESIS, event_hash
    with sqlite3.connect(db) as c:
        c.execute("DROP TRIGGER IF EXISTS events_no_update")
        rows = c.execute("SELECT seq, type, schema_v, mono_ns, wall_ns, window_id, causation_seq, payload, prev_hash "
                         "FROM events WHERE seq >= ? ORDER BY seq", (from_seq,)).fetchall()
        prev = c.execute("SELECT hash FROM events WHERE seq = ?", (from_seq - 1,)).fetchone()
        prev = prev[0] if prev else GENESIS
        for seq, type_, v, mono, wall, wid, cause, payload, _p in rows:
            if seq == from_seq:
                payload = payload.replace(b'"ok":true', b'"ok":false', 1) if b'"ok":true' in payload else payload + b" "
            h = event_hash(prev, seq, type_, v, mono, wall, wid, cause, payload)
            c.execute("UPDATE events SET payload = ?, prev_hash = ?, hash = ? WHERE seq = ?", (payload, prev, h, seq))
            prev = h


async def test_a_local_log_rewritten_after_shipping_is_caught_at_the_first_differing_seq(fleet, tmp_path):
    db = _log(tmp_path)
    await _ship_all(fleet, "h1", db)
    _rewrite(db, 40)
    res = await verify_host(role_dsn(fleet, "alice", "flare_diag_operator"), "h1", db)
    assert not res["ok"] and res["first_differing_seq"] == 40


async def test_a_fork_on_shipping_is_refused_and_raised_as_an_alarm(fleet, tmp_path):
    db = _log(tmp_path)
    async with await psycopg.AsyncConnection.connect(fleet) as conn:
        await ship_once(conn, "h1", "pool-a", db, 100)
        _rewrite(db, 50)
        with pytest.raises(Fork, match="seq 100"):
            await ship_once(conn, "h1", "pool-a", db, 100)
        alarms = await (await conn.execute("SELECT kind, detail FROM alarms WHERE host = 'h1'")).fetchall()
        head = await (await conn.execute("SELECT head_seq FROM hosts WHERE host = 'h1'")).fetchone()
    assert alarms and alarms[0][0] == "fork" and head == (100,)


async def test_the_database_refuses_a_head_that_skips_its_own_chain_check(fleet, tmp_path):
    db = _log(tmp_path)
    async with await psycopg.AsyncConnection.connect(fleet) as conn:
        await ship_once(conn, "h1", "pool-a", db, 10)
        with pytest.raises(psycopg.errors.RaiseException, match="not all held"):
            await conn.execute("UPDATE hosts SET head_seq = 20 WHERE host = 'h1'")


async def _pool(dsn: str, pool: str, k: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("INSERT INTO pools (pool, max_down) VALUES (%s, %s) ON CONFLICT (pool) DO UPDATE SET "
                           "max_down = EXCLUDED.max_down", (pool, k))


async def test_two_hundred_concurrent_lease_attempts_never_grant_more_than_k(fleet):
    await _pool(fleet, "pool-a", 3)
    granted: list[str] = []
    refused: list[str] = []
    dsns = {i: role_dsn(fleet, f"h{i}") for i in range(200)}  # each host as its own login role

    async def attempt(i: int) -> None:
        async with await psycopg.AsyncConnection.connect(dsns[i]) as conn:
            try:
                await lease.take(conn, "pool-a", f"h{i}", f"w{i}", "test")
                granted.append(f"h{i}")
            except lease.PoolFull:
                refused.append(f"h{i}")

    async with anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(attempt, i)
    assert len(granted) == 3 and len(refused) == 197


async def test_the_documented_host_role_takes_and_releases_a_lease(fleet):
    await _pool(fleet, "pool-a", 1)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as conn:
        got = await lease.take(conn, "pool-a", "h1", "w1", "test")
        assert got.how == "taken" and got.epoch >= 1
        assert await lease.release(conn, "h1", "test", "done", window_id="w1")


async def test_a_full_pool_names_who_holds_its_slots(fleet):
    await _pool(fleet, "pool-a", 1)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as h1, \
            await psycopg.AsyncConnection.connect(role_dsn(fleet, "h2")) as h2:
        await lease.take(h1, "pool-a", "h1", "w1", "test")
        with pytest.raises(lease.PoolFull, match=r"h1 \(window w1, held\)"):
            await lease.take(h2, "pool-a", "h2", "w2", "test")


async def test_a_host_resuming_its_window_keeps_its_lease_under_the_same_epoch(fleet):
    await _pool(fleet, "pool-a", 1)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as conn:
        first = await lease.take(conn, "pool-a", "h1", "w1", "test")
        again = await lease.take(conn, "pool-a", "h1", "w1", "test")
    assert (first.how, again.how) == ("taken", "kept") and first.epoch == again.epoch


async def test_a_lease_is_a_windows_so_the_hosts_next_window_does_not_keep_it(fleet):
    await _pool(fleet, "pool-a", 1)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as conn:
        await lease.take(conn, "pool-a", "h1", "w1", "test")
        with pytest.raises(lease.HeldByAnotherWindow, match="earlier window w1"):
            await lease.take(conn, "pool-a", "h1", "w2", "test")


async def test_max_down_1_a_delayed_release_of_the_earlier_window_never_lets_two_primaries_out(fleet):
    """Issue 49's reproduction: h1's window w1 closes verified; its release comes late, after h1's next
    window w2 took the lease. The late release must not free w2's lease for h2 to take."""
    await _pool(fleet, "pool-a", 1)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as h1, \
            await psycopg.AsyncConnection.connect(role_dsn(fleet, "h2")) as h2:
        first = await lease.take(h1, "pool-a", "h1", "w1", "flare-diagd")
        assert await lease.release(h1, "h1", "flare-diagd", "restoration verified", window_id="w1")
        second = await lease.take(h1, "pool-a", "h1", "w2", "flare-diagd")
        assert second.epoch > first.epoch
        # the duplicate, late release of w1 (a reconcile that read the log before w2 began)
        assert not await lease.release(h1, "h1", "flare-diagd", "restoration verified", window_id="w1")
        with pytest.raises(lease.PoolFull):
            await lease.take(h2, "pool-a", "h2", "w3", "flare-diagd")
        out = await (await h1.execute("SELECT host, window_id FROM leases WHERE pool = 'pool-a'")).fetchall()
    assert out == [("h1", "w2")]


async def test_a_lease_reasserted_under_its_epoch_holds_and_one_granted_again_since_does_not(fleet):
    await _pool(fleet, "pool-a", 1)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as conn:
        got = await lease.take(conn, "pool-a", "h1", "w1", "test")
        assert await lease.reassert(conn, "h1", "w1", got.epoch) is None
        await lease.release(conn, "h1", "test", "by hand")
        assert "holds no lease" in await lease.reassert(conn, "h1", "w1", got.epoch)
        again = await lease.take(conn, "pool-a", "h1", "w1", "test")
        assert f"epoch {again.epoch}" in await lease.reassert(conn, "h1", "w1", got.epoch)


async def test_a_host_role_cannot_take_change_or_free_another_hosts_lease(fleet):
    await _pool(fleet, "pool-a", 2)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as h1, \
            await psycopg.AsyncConnection.connect(role_dsn(fleet, "h2"), autocommit=True) as h2:
        await lease.take(h1, "pool-a", "h1", "w1", "test")
        assert not await lease.release(h2, "h1", "h2", "not mine")  # row-level security: no row of h1's to delete
        cur = await h2.execute("UPDATE leases SET window_id = 'forged' WHERE host = 'h1'")
        assert cur.rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await h2.execute("INSERT INTO leases (host, pool, window_id) VALUES ('h3', 'pool-a', 'w9')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await h2.execute("UPDATE pools SET max_down = 100")
        assert await (await h2.execute("SELECT count(*) FROM leases")).fetchone() == (1,)  # it reads the pool's


def test_a_command_the_database_refuses_is_one_line_with_its_words(fleet, capsys):
    from flare_diag.daemon.cli.commands import main
    host = role_dsn(fleet, "h3")  # a host's role may not set a pool's K
    assert main(["fleet", "pool", "set", "pool-a", "--max-down", "5", "--dsn", host]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "permission denied for table pools" in err and "Traceback" not in err, err


async def test_a_host_role_ships_only_its_own_events(fleet, tmp_path):
    db = _log(tmp_path)
    await _pool(fleet, "pool-a", 1)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h2")) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await ship_once(conn, "h1", "pool-a", db, 100)
    assert await _ship_all(fleet, "h1", db) == len(_local(db))  # as h1's own role (the helper)


async def test_a_lease_after_a_failed_restore_stays_held_until_a_person_releases_it(fleet):
    await _pool(fleet, "pool-a", 2)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as conn, \
            await psycopg.AsyncConnection.connect(role_dsn(fleet, "alice", "flare_diag_operator")) as alice:
        await lease.take(conn, "pool-a", "h1", "w1", "flare-diagd")
        await lease.needs_person(conn, "h1", "w1", "flare-diagd", "restore_failed")
        with pytest.raises(lease.NeedsPerson, match="did not verify"):
            await lease.take(conn, "pool-a", "h1", "w2", "flare-diagd")
        assert await lease.release(alice, "h1", "alice", "restored by hand")
        log = await (await conn.execute("SELECT change, caller, reason FROM lease_log WHERE host = 'h1' ORDER BY id")).fetchall()
    assert log == [("taken", "flare-diagd", ""), ("needs_a_person", "flare-diagd", "restore_failed"),
                   ("released", "alice", "restored by hand")]


def test_a_window_report_rebuilt_from_the_fleet_is_the_hosts_own_byte_for_byte(fleet, tmp_path, capsysbinary):
    from flare_diag.daemon.cli.commands import main
    db = _log(tmp_path, "restore-path")
    anyio.run(_ship_all, fleet, "h1", db)
    from flare_diag.events.reader import LogReader
    with LogReader(db) as r:
        window = r.window_ids()[-1]
    for fmt in ("json", "md", "html"):
        assert main(["report", str(db), "--window", window, "--format", fmt]) == 0
        own = capsysbinary.readouterr().out
        assert main(["fleet", "report", window, "--format", fmt, "--dsn", role_dsn(fleet, "alice", "flare_diag_operator")]) == 0
        assert capsysbinary.readouterr().out == own and len(own) > 1000


async def test_reports_of_several_windows_over_two_hosts_each_equal_the_hosts_own(fleet, tmp_path):
    from flare_diag.daemon.fleet.views import reports
    from flare_diag.daemon.reports.publish import build_report
    from tests.logtools import write_window
    logs = {"h1": tmp_path / "h1.db", "h2": tmp_path / "h2.db"}
    await write_window(logs["h1"], window_id="w-a")
    await write_window(logs["h1"], window_id="w-b")
    await write_window(logs["h2"], window_id="w-c")
    for host, db in logs.items():
        await _ship_all(fleet, host, db)
    asked = ["w-c", "w-b", "w-a"]
    got = await reports(role_dsn(fleet, "alice", "flare_diag_operator"), asked)
    assert list(got) == asked
    own = {w: build_report(logs["h2" if w == "w-c" else "h1"], w) for w in asked}
    assert got == own and {r["window_id"] for r in got.values()} == set(asked)


# --- campaign runs with a visibility timeout -------------------------------------------------------

async def _campaign(fleet: str, retries: int = 1, visibility_s: float = 1.0) -> int:
    from flare_diag.daemon.fleet import campaigns
    operator = role_dsn(fleet, "alice", "flare_diag_operator")
    return await campaigns.create(operator, 'name = "p"\n', "p", "site", ["h1"], 1, 1.0, False, "alice",
                                  retries=retries, visibility_s=visibility_s)


async def _state(fleet: str, campaign: int) -> tuple:
    async with await psycopg.AsyncConnection.connect(fleet) as conn:
        return await (await conn.execute("SELECT state, attempts, detail FROM runs WHERE campaign = %s", (campaign,))).fetchone()


async def test_a_claim_its_daemon_stops_renewing_expires_and_the_run_is_queued_again(fleet):
    from flare_diag.daemon.fleet import campaigns
    cid = await _campaign(fleet, retries=1, visibility_s=1.0)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as h1:
        assert (await campaigns.claim(h1, "h1")).run == 1
        assert (await _state(fleet, cid))[:2] == ("claimed", 1)
        await _age_claims(fleet, cid)  # its daemon died: nothing renewed the claim in time
        assert await campaigns.expire(h1, "h1") == [(cid, 1, "queued")]
    state, attempts, detail = await _state(fleet, cid)
    assert (state, attempts) == ("queued", 1) and "claim expired" in detail


async def _age_claims(fleet: str, campaign: int) -> None:
    """Every claim of the campaign past its timeout, as if its daemon had been silent that long (no sleep:
    the database's clock is moved past, not waited for)."""
    async with await psycopg.AsyncConnection.connect(fleet, autocommit=True) as admin:
        await admin.execute("UPDATE runs SET lease_until = now() - interval '1 second' WHERE campaign = %s", (campaign,))


async def test_a_renewed_claim_does_not_expire(fleet):
    from flare_diag.daemon.fleet import campaigns
    cid = await _campaign(fleet, visibility_s=60.0)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as h1:
        run = await campaigns.claim(h1, "h1")
        for _ in range(3):
            await _age_claims(fleet, cid)  # it would expire now, but for the renewal
            assert await campaigns.renew(h1, "h1", [], (run.campaign, run.run)) == 1
        assert await campaigns.expire(h1, "h1") == []
    assert (await _state(fleet, cid))[0] == "claimed"


async def test_a_claim_no_start_is_under_way_for_is_not_renewed_and_goes_back_to_the_queue(fleet):
    """A start refused after the claim, its mark lost with the database: the daemon is alive and renews,
    but not this claim, so it expires and the run is queued again instead of staying claimed for ever."""
    from flare_diag.daemon.fleet import campaigns
    cid = await _campaign(fleet, visibility_s=60.0)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as h1:
        await campaigns.claim(h1, "h1")
        await _age_claims(fleet, cid)
        assert await campaigns.renew(h1, "h1", [], None) == 0
        assert await campaigns.expire(h1, "h1") == [(cid, 1, "queued")]


async def test_a_run_whose_window_the_hosts_log_names_is_adopted_running_under_it_not_claimed_again(fleet):
    """The "running" mark lost (the database failed over between the start and the mark), the claim
    then expired: the host's log names the run's window, so the run is adopted, never started twice."""
    from flare_diag.daemon.fleet import campaigns
    cid = await _campaign(fleet, visibility_s=0.2)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as h1:
        run = await campaigns.claim(h1, "h1")
        await _age_claims(fleet, cid)
        await campaigns.expire(h1, "h1")
        assert await campaigns.unmarked(h1, "h1") == [(cid, 1, run.claim_us)]
        await campaigns.adopt(h1, cid, 1, run.claim_us, "w-started")
        assert await campaigns.claim(h1, "h1") is None
        assert await campaigns.unmarked(h1, "h1") == []
        await campaigns.finish(h1, "w-started", "completed", None, True)
    assert (await _state(fleet, cid))[0] == "done"


async def test_a_run_an_operator_requeued_is_run_again_not_adopted_from_an_earlier_claims_window(fleet):
    """The host's log names the window of the run's earlier claim; the operator requeued the run after it
    failed: that claim is not this one, so the run is claimed and run again."""
    from flare_diag.daemon.fleet import campaigns
    cid = await _campaign(fleet, retries=0, visibility_s=0.2)
    operator = role_dsn(fleet, "alice", "flare_diag_operator")
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as h1:
        earlier = await campaigns.claim(h1, "h1")  # its window ran; then the daemon was down past the timeout
        await _age_claims(fleet, cid)
        await campaigns.expire(h1, "h1")  # retries spent: failed
        assert await campaigns.requeue(operator, cid, "alice") == 1
        assert await campaigns.unmarked(h1, "h1") == []  # no claim to match the log's
        await campaigns.adopt(h1, cid, 1, earlier.claim_us, "w-earlier")  # what a stale match would do: nothing
        again = await campaigns.claim(h1, "h1")
    assert again is not None and again.claim_us != earlier.claim_us
    assert (await _state(fleet, cid))[0] == "claimed"


async def test_a_run_whose_claims_keep_expiring_fails_once_its_retries_are_spent(fleet):
    from flare_diag.daemon.fleet import campaigns
    cid = await _campaign(fleet, retries=1, visibility_s=0.2)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as h1:
        for _ in range(2):  # the first claim and its one retry
            assert await campaigns.claim(h1, "h1") is not None
            await _age_claims(fleet, cid)
        assert await campaigns.claim(h1, "h1") is None  # the expiry it ran first failed the run
    state, attempts, detail = await _state(fleet, cid)
    assert (state, attempts) == ("failed", 2) and "retries spent" in detail


async def test_a_run_whose_window_closes_after_its_claim_expired_is_still_marked_done(fleet):
    from flare_diag.daemon.fleet import campaigns
    cid = await _campaign(fleet, visibility_s=0.2)
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as h1:
        run = await campaigns.claim(h1, "h1")
        await campaigns.mark(h1, run, "running", "w-late")
        await _age_claims(fleet, cid)
        await campaigns.expire(h1, "h1")  # its daemon was down for a while
        await campaigns.finish(h1, "w-late", "completed", "not_reproduced", True)  # back, its log says closed
    assert (await _state(fleet, cid))[0] == "done"


def test_a_start_refused_by_a_full_pool_or_a_silent_database_is_for_later_not_for_good():
    from flare_diag.daemon.fleet.campaigns import requeue_after
    assert requeue_after({"ok": False, "code": "busy"}) and requeue_after({"ok": False, "code": "fleet_unavailable"})
    assert not requeue_after({"ok": False, "error": "plan: bad"})


async def test_an_operator_cancels_and_requeues_a_campaigns_runs(fleet):
    from flare_diag.daemon.fleet import campaigns
    cid = await _campaign(fleet)
    operator = role_dsn(fleet, "alice", "flare_diag_operator")
    assert await campaigns.cancel(operator, cid, "alice") == 1
    assert (await _state(fleet, cid))[0] == "cancelled"
    async with await psycopg.AsyncConnection.connect(role_dsn(fleet, "h1")) as h1:
        assert await campaigns.claim(h1, "h1") is None
    assert await campaigns.requeue(operator, cid, "alice") == 1
    assert (await _state(fleet, cid))[:2] == ("queued", 0)


@pytest.mark.parametrize("verb", ["cancel", "requeue"])
def test_cancelling_or_requeueing_a_campaign_that_is_not_there_says_so(fleet, capsys, verb):
    from flare_diag.daemon.cli.commands import main
    operator = role_dsn(fleet, "alice", "flare_diag_operator")
    assert main(["fleet", "campaign", verb, "999", "--dsn", operator]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "campaign 999: no such campaign" in err, err


def test_a_hosts_dsn_line_keeps_every_server_and_setting_and_drops_the_callers_credentials():
    from psycopg.conninfo import conninfo_to_dict

    from flare_diag.daemon.fleet.db import host_dsn
    given = ("host=db-a,db-b port=5432,5433 dbname=flare user=flare_admin password=secret passfile=/root/.pgpass "
             "sslmode=verify-full sslcert=/root/admin.crt sslkey=/root/admin.key target_session_attrs=read-write")
    got = conninfo_to_dict(host_dsn(given, "gpu17", "flare"))
    assert got == {"host": "db-a,db-b", "port": "5432,5433", "dbname": "flare", "user": "gpu17", "sslmode": "verify-full",
                   "target_session_attrs": "read-write"}
    assert "secret" not in host_dsn(given, "gpu17", "flare")
    assert conninfo_to_dict(host_dsn("host=/run/pg", "gpu18", "fleet"))["dbname"] == "fleet"  # the database connected to


async def test_a_claimed_run_is_committed_as_claimed_before_its_window_starts(fleet, tmp_path):
    """The claim is in the database before the start it leads to: a failover during the start cannot lose it
    (the drill in docs/fleet.md ran a run twice when the claim waited, uncommitted, for the start's mark)."""
    import structlog

    from flare_diag.daemon.fleet.config import FleetConfig
    from flare_diag.daemon.service.fleetlink import FleetLink
    from flare_diag.events.store import EventStore
    cid = await _campaign(fleet, visibility_s=60.0)
    db = tmp_path / "log.db"
    await (await EventStore.open(db)).close()
    dsn = role_dsn(fleet, "h1")
    link = FleetLink(FleetConfig(dsn=dsn, host="h1", pool="p"), dsn, db, structlog.get_logger(), lambda: None)
    seen: list[tuple] = []

    async def starter(run) -> dict:  # noqa: ANN001 - a claimed run
        seen.append(await _state(fleet, cid))  # read by another connection, as a promoted standby would have it
        return {"ok": True, "window_id": "w-1"}
    link.starter, link.idle = starter, lambda: True
    assert await link._claim_and_start() is False
    assert [s[:2] for s in seen] == [("claimed", 1)]
