"""Campaigns: one plan queued on several hosts (repeats included), each run claimed by its host's daemon.

A run is claimed with `FOR UPDATE SKIP LOCKED` (two claimers never take the same run and never wait on
each other), started as an operator's `start` would be (the plan's content from the database, checked
against its hash; the site a name in the host's own sites directory), and closed from the host's own
log once its window closes. A run refused because the pool is full goes back to the queue.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from flare_diag.daemon.fleet.config import check_name
from flare_diag.daemon.fleet.dsn import FleetError
from flare_diag.daemon.fleet.db import connect


# a claim's token: its claimed_at in whole microseconds (what a window's campaign_run_started records)
_CLAIM_US = "(extract(epoch FROM r.claimed_at) * 1000000)::bigint"


@dataclass
class Run:
    campaign: int
    run: int
    repeat: int
    plan_toml: str
    plan_sha256: str
    site: str
    time_scale: float
    accept_partial: bool
    claim_us: int = 0  # this claim's token (its claimed_at, in microseconds): a window names the claim it ran

    @property
    def label(self) -> str:
        return f"campaign {self.campaign} run {self.run}"


async def create(dsn: str, plan_toml: str, plan_name: str, site: str, hosts: list[str], repeats: int,
                 time_scale: float, accept_partial: bool, caller: str, order: Sequence[str] | None = None,
                 candidate_site: str | None = None, retries: int = 2, visibility_s: float = 120.0) -> int:
    """`order`: a follow-on plan's sides (baseline/candidate), one a repeat; the candidate's runs use
    `candidate_site` (the policy's build), the baseline's `site`."""
    for h in hosts:
        check_name("host", h)
    check_name("site", site)
    if not hosts or len(set(hosts)) != len(hosts):
        raise FleetError(f"--hosts {','.join(hosts)}: expected one or more distinct hosts")
    if order:
        repeats = len(order)
        if not candidate_site:
            raise FleetError("a follow-on plan's campaign needs --candidate-site NAME (the site whose candidate "
                             "recipe is the policy's build)")
        check_name("site", candidate_site)
    if not 1 <= repeats <= 100:
        raise FleetError(f"--repeats {repeats}: expected 1 to 100")
    sha = hashlib.sha256(plan_toml.encode()).hexdigest()
    async with await connect(dsn) as conn:
        async with conn.transaction():
            row = await (await conn.execute(
                "INSERT INTO campaigns (plan_name, plan_toml, plan_sha256, site, time_scale, accept_partial, repeats, "
                "created_by, candidate_site, retries, visibility_s) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "RETURNING campaign",
                (plan_name, plan_toml, sha, site, time_scale, accept_partial, repeats, caller,
                 candidate_site if order else None, retries, visibility_s))).fetchone()
            assert row is not None  # an INSERT ... RETURNING returns its row
            campaign = row[0]
            n = 0
            for r in range(1, repeats + 1):
                for h in hosts:  # repeat by repeat, so that the hosts' runs of one repeat sit side by side
                    n += 1
                    await conn.execute("INSERT INTO runs (campaign, run, host, repeat, side) VALUES (%s, %s, %s, %s, %s)",
                                       (campaign, n, h, r, order[r - 1] if order else None))
    return campaign


async def expire(conn: psycopg.AsyncConnection, host: str) -> list[tuple[int, int, str]]:
    """This host's claimed or running runs whose claim was not renewed in time: back to the queue, or
    `failed` once their campaign's retries are spent; (campaign, run, new state) of each."""
    async with conn.transaction():
        rows = await (await conn.execute(
            "UPDATE runs r SET state = CASE WHEN r.attempts > c.retries THEN 'failed' ELSE 'queued' END, "
            "lease_until = NULL, detail = CASE WHEN r.attempts > c.retries THEN "
            "'its claim expired ' || r.attempts || ' times (its daemon stopped renewing it); retries spent' "
            "ELSE 'its claim expired (its daemon stopped renewing it); queued again' END "
            "FROM campaigns c WHERE c.campaign = r.campaign AND r.host = %s AND r.state IN ('claimed', 'running') "
            "AND r.lease_until < now() RETURNING r.campaign, r.run, r.state", (host,))).fetchall()
    return [tuple(r) for r in rows]


async def renew(conn: psycopg.AsyncConnection, host: str, window_ids: list[str],
                claiming: tuple[int, int] | None = None) -> int:
    """The claims of this host's runs that are still its daemon's (running one of `window_ids`, or the run
    `claiming` being started now), renewed for their campaign's visibility timeout; how many. A claim
    whose start left no window in the log is not renewed: it expires and goes back to the queue."""
    campaign, run = claiming or (None, None)
    async with conn.transaction():
        cur = await conn.execute(
            "UPDATE runs r SET lease_until = now() + make_interval(secs => c.visibility_s) FROM campaigns c "
            "WHERE c.campaign = r.campaign AND r.host = %s AND ((r.state = 'claimed' AND r.campaign = %s AND r.run = %s) "
            "OR (r.state = 'running' AND r.window_id = ANY(%s)))", (host, campaign, run, window_ids))
    return cur.rowcount


async def unmarked(conn: psycopg.AsyncConnection, host: str) -> list[tuple[int, int, int]]:
    """(campaign, run, claim token) of this host's runs claimed or queued without a window under their last
    claim: the ones whose window, if the host's log names that claim, the database never heard of. A run an
    operator requeued has no claim (requeue clears it): whatever an earlier claim's window did, it runs again."""
    rows = await (await conn.execute(f"SELECT campaign, run, {_CLAIM_US} FROM runs r WHERE host = %s AND state IN "
                                     "('claimed', 'queued') AND window_id IS NULL AND claimed_at IS NOT NULL",
                                     (host,))).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


async def adopt(conn: psycopg.AsyncConnection, campaign: int, run: int, claim_us: int, window_id: str) -> None:
    """A run whose claim `claim_us` the host's own log says `window_id` ran: running under it, claimed for
    its visibility timeout (unless it was claimed again or requeued since)."""
    async with conn.transaction():
        await conn.execute("UPDATE runs r SET state = 'running', window_id = %s, detail = '', "
                           "lease_until = now() + make_interval(secs => c.visibility_s) FROM campaigns c "
                           "WHERE c.campaign = r.campaign AND r.campaign = %s AND r.run = %s AND r.state IN "
                           f"('claimed', 'queued') AND r.window_id IS NULL AND {_CLAIM_US} = %s",
                           (window_id, campaign, run, claim_us))


def requeue_after(reply: dict) -> bool:
    """Whether a start the daemon refused for a claimed run is for later, not for good: the pool was full
    (`busy`), or the fleet database could not answer (`fleet_unavailable`: a hang delays a run)."""
    return reply.get("code") in ("busy", "fleet_unavailable")


async def claim(conn: psycopg.AsyncConnection, host: str) -> Run | None:
    """This host's next queued run, claimed for its campaign's visibility timeout; None when it has none."""
    await expire(conn, host)
    async with conn.transaction():
        row = await (await conn.execute(
            "SELECT r.campaign, r.run, r.repeat, c.plan_toml, c.plan_sha256, "
            "CASE WHEN r.side = 'candidate' THEN c.candidate_site ELSE c.site END, c.time_scale, c.accept_partial "
            "FROM runs r JOIN campaigns c USING (campaign) WHERE r.host = %s AND r.state = 'queued' "
            "ORDER BY r.campaign, r.run LIMIT 1 FOR UPDATE OF r SKIP LOCKED", (host,))).fetchone()
        if row is None:
            return None
        token = await (await conn.execute(
            "UPDATE runs r SET state = 'claimed', claimed_at = clock_timestamp(), attempts = r.attempts + 1, "
            "lease_until = now() + make_interval(secs => c.visibility_s) FROM campaigns c "
            "WHERE c.campaign = r.campaign AND r.campaign = %s AND r.run = %s "
            f"RETURNING {_CLAIM_US}", (row[0], row[1]))).fetchone()
    assert token is not None  # the row was locked above: the UPDATE finds it
    return replace(Run(*row), claim_us=token[0])


async def mark(conn: psycopg.AsyncConnection, run: Run, state: str, window_id: str | None = None, detail: str = "") -> None:
    async with conn.transaction():
        await conn.execute("UPDATE runs SET state = %s, window_id = COALESCE(%s, window_id), detail = %s "
                           "WHERE campaign = %s AND run = %s", (state, window_id, detail, run.campaign, run.run))


async def running(conn: psycopg.AsyncConnection, host: str) -> list[str]:
    """Window ids of this host's runs still marked running."""
    rows = await (await conn.execute("SELECT window_id FROM runs WHERE host = %s AND state = 'running'", (host,))).fetchall()
    return [r[0] for r in rows]


async def finish(conn: psycopg.AsyncConnection, window_id: str, outcome: str | None, verdict: str | None,
                 verified: bool) -> None:
    async with conn.transaction():
        # a run whose claim expired while its daemon was down is still this window's once the window closes
        await conn.execute("UPDATE runs SET state = 'done', finished_at = now(), outcome = %s, verdict = %s, "
                           "restoration_verified = %s, lease_until = NULL WHERE window_id = %s AND state IN "
                           "('running', 'queued')", (outcome, verdict, verified, window_id))


async def cancel(dsn: str, campaign: int, caller: str) -> int:
    """Every run of the campaign not started yet (queued, claimed) is cancelled; how many."""
    async with await connect(dsn) as conn:
        async with conn.transaction():
            await _exists(conn, campaign)
            cur = await conn.execute("UPDATE runs SET state = 'cancelled', lease_until = NULL, detail = %s WHERE "
                                     "campaign = %s AND state IN ('queued', 'claimed')", (f"cancelled by {caller}", campaign))
            return cur.rowcount


async def requeue(dsn: str, campaign: int, caller: str, run: int | None = None) -> int:
    """The campaign's failed, refused or cancelled runs (or run `run`) queued again, attempts from zero; how many."""
    async with await connect(dsn) as conn:
        async with conn.transaction():
            await _exists(conn, campaign)
            cur = await conn.execute(
                "UPDATE runs SET state = 'queued', attempts = 0, lease_until = NULL, window_id = NULL, claimed_at = NULL, "
                "detail = %s "
                "WHERE campaign = %s AND state IN ('failed', 'refused', 'cancelled') AND (%s::integer IS NULL OR run = %s)",
                (f"requeued by {caller}", campaign, run, run))
            return cur.rowcount


async def _exists(conn: psycopg.AsyncConnection, campaign: int) -> None:
    """FleetError unless the campaign is there: a mistyped number is said, not answered with "0 runs"."""
    if await (await conn.execute("SELECT 1 FROM campaigns WHERE campaign = %s", (campaign,))).fetchone() is None:
        raise FleetError(f"campaign {campaign}: no such campaign")


async def acceptance(dsn: str, runs: list[dict], repeats: int, bar: dict[str, float] | None = None) -> dict:
    """Per host, the seed's acceptance rule (report compare's) over its candidate and baseline runs, each
    run's report rebuilt from the fleet's events; `bar`: the plan's (policies.acceptance.acceptance_bar)."""
    from flare_diag.daemon.fleet.views import reports
    from flare_diag.daemon.reports.compare import run_of
    from flare_diag.policies.acceptance import accept
    out: dict[str, dict[str, Any]] = {}
    for host in sorted({r["host"] for r in runs}):
        mine = [r for r in runs if r["host"] == host]
        if any(r["state"] != "done" for r in mine):
            out[host] = {"accepted": None, "reason": "runs still to finish"}
            continue
        # the host's log is rebuilt and audited once for all its runs (once a run, it grew with the runs squared)
        built = await reports(dsn, [r["window_id"] for r in mine])
        sides: dict[str, list] = {"candidate": [], "baseline": []}
        for r in mine:
            sides[r["side"]].append(run_of(built[r["window_id"]]))
        verdict = accept(sides["candidate"], sides["baseline"], repeats=repeats, **(bar or {}))
        out[host] = {"accepted": verdict.accepted, "reason": verdict.reason,
                     "primary_benefit": verdict.primary_benefit, "worst_regression": verdict.worst_regression,
                     "bar": {"min_benefit": verdict.min_benefit, "max_regression": verdict.max_regression}}
    return out


async def show(dsn: str, campaign: int) -> dict:
    async with await connect(dsn) as conn:
        c = await (await conn.execute("SELECT campaign, plan_name, plan_sha256, site, repeats, created_at, created_by, "
                                      "candidate_site, plan_toml FROM campaigns WHERE campaign = %s", (campaign,))).fetchone()
        if c is None:
            raise FleetError(f"campaign {campaign}: no such campaign")
        runs = await (await conn.execute(
            "SELECT run, host, repeat, state, window_id, outcome, verdict, restoration_verified, detail, side FROM runs "
            "WHERE campaign = %s ORDER BY run", (campaign,))).fetchall()
    rows = [{"run": r, "host": h, "repeat": rep, "side": side, "state": s, "window_id": w, "outcome": o, "verdict": v,
             "restoration_verified": rv, "detail": d, "report": f"flare-diag fleet report {w}" if w else None}
            for r, h, rep, s, w, o, v, rv, d, side in runs]
    done = [r for r in rows if r["state"] == "done"]
    verdicts = sorted({r["verdict"] for r in done if r["verdict"]})
    follow_on = any(r["side"] for r in rows)
    if follow_on:
        import msgspec

        from flare_diag.policies.acceptance import acceptance_bar
        accepted = await acceptance(dsn, rows, c[4] // 2, acceptance_bar(msgspec.toml.decode(c[8])))
    else:
        accepted = None
    return {"campaign": c[0], "plan": c[1], "plan_sha256": c[2], "site": c[3], "candidate_site": c[7],
            "repeats": c[4], "created_at": c[5].isoformat(), "created_by": c[6], "runs": rows, "acceptance": accepted,
            "summary": {"runs": len(rows), "done": len(done),
                        "restorations_verified": sum(1 for r in done if r["restoration_verified"]),
                        "verdicts": verdicts,
                        # one plan (by hash), one site name, each run on the host it was queued for: the
                        # repeats are matched in what the fleet can see; the windows' own logs hold the rest
                        "verdicts_agree": len(verdicts) <= 1 and len(done) == len(rows)}}
