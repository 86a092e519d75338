"""The service's link to the fleet: the shipper, the pool lease at `start`, and the lease's release.

Only the lease is on a window's path, and only before anything changes: `start` refuses when the
database cannot grant it. After that nothing here can block, slow or abort a window. The release is
decided from the local log, not from memory: a window whose log records a verified restoration gives
its lease back; one whose restoration did not verify leaves it held for a person. The same check runs
after every window and every few seconds while none runs, so a daemon restarted mid-window, or one
that lost the database at the wrong moment, releases its lease once its own log says it may.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any
from pathlib import Path

import anyio

from flare_diag.events.reader import LogReader
from flare_diag.events.schema import (
    CampaignRunStarted, LeaseGranted, RestorationRecorded, VerdictReached, WindowClosed, WindowOpened,
)
from flare_diag.events.signals import quiet
from flare_diag.daemon.fleet import campaigns, lease
from flare_diag.daemon.fleet.config import FleetConfig
from flare_diag.daemon.fleet.db import connect, one_line
from flare_diag.daemon.fleet.shipper import Shipper

RECONCILE_S = 5.0
CAMPAIGN_POLL_S = 5.0  # a daemon with nothing to wake it looks for queued runs this often
CAMPAIGN_BUSY_S = 2.0  # after the pool refused a run, the wait before this host tries again
CALLER = "flare-diagd"


def _logged(db: Path, types: tuple[str, ...], window_id: str | None = None) -> list[tuple[str, object]]:
    """(window id, event) of the local log's events of `types` (of one window), in order."""
    with LogReader(db) as reader:
        return [(e.window_id, e.event()) for e in reader.iter(window_id=window_id, types=types)]


def window_end(db: Path, window_id: str) -> dict:
    """What a window's local log records of its end: opened, closed, outcome, verdict, restoration verified."""
    end: dict[str, object] = {"opened": False, "closed": False, "outcome": None, "verdict": None, "verified": False}
    for _wid, ev in _logged(db, ("window_opened", "window_closed", "restoration_recorded", "verdict_reached"), window_id):
        if isinstance(ev, WindowOpened):
            end["opened"] = True
        elif isinstance(ev, WindowClosed):
            end.update(closed=True, outcome=ev.outcome)
        elif isinstance(ev, VerdictReached):
            end["verdict"] = ev.hypothesis
        elif isinstance(ev, RestorationRecorded):
            end["verified"] = bool(ev.verified)
    return end


def granted_epoch(db: Path, window_id: str) -> int | None:
    """The fencing epoch the window's local log recorded for its lease, or None."""
    granted = [ev.epoch for _wid, ev in _logged(db, ("lease_granted",), window_id) if isinstance(ev, LeaseGranted)]
    return granted[-1] if granted else None


def campaign_windows(db: Path) -> dict[tuple[int, int, int], str]:
    """(campaign, run, claim token) -> the window its local log says ran that claim."""
    return {(ev.campaign, ev.run, ev.claim_us): wid for wid, ev in _logged(db, ("campaign_run_started",))
            if isinstance(ev, CampaignRunStarted)}


class FleetLink:
    def __init__(self, cfg: FleetConfig, dsn: str, db: Path, log, running) -> None:
        self.cfg, self.dsn, self.db, self.log = cfg, dsn, db, log
        self.running = running  # () -> the window id running now, or None
        self.shipper = Shipper(cfg, dsn, db, log)
        self.lease: dict | None = None  # as the database last said
        self.lease_error: str | None = None
        self.pending: str | None = None  # a window between its lease and its launch: running, for the release
        self.starter: Callable[[campaigns.Run], Awaitable[dict[str, Any]]] | None = None  # set by the service
        self.idle = lambda: False  # set by the service: whether a new window may start now
        self.campaigns = False  # the database has campaigns (and this link is listening for runs)
        self.claiming: tuple[int, int] | None = None  # the run between its claim and its "running" mark
        self.granted: dict[str, int] = {}  # window id -> the fencing epoch its lease was granted under
        self.lease_lost = lambda window_id, why: None  # set by the service: aborts a window whose lease is gone
        self._wake = anyio.Event()

    async def check_room(self) -> None:
        """PoolFull or NeedsPerson now, before the start's preflight; takes nothing."""
        async with await connect(self.dsn, autocommit=True) as conn:
            await lease.check_room(conn, self.cfg.pool, self.cfg.host)

    async def take_lease(self, window_id: str, caller: str) -> lease.Grant:
        """Before anything changes: the grant ('taken' or 'kept', its epoch); PoolFull, NeedsPerson,
        HeldByAnotherWindow or FleetError refuse the start. An earlier window's lease that its own log
        lets go is released first, from that log, never on the word of memory."""
        await self.reconcile()
        self.pending = window_id
        async with await connect(self.dsn, autocommit=True) as conn:  # the grant commits before it is read back
            got = await lease.take(conn, self.cfg.pool, self.cfg.host, window_id, f"{CALLER} for {caller}")
            self.lease = await lease.held(conn, self.cfg.host)
        self.granted[window_id] = got.epoch
        self.log.info("fleet lease " + got.how, pool=self.cfg.pool, host=self.cfg.host, window_id=window_id,
                      epoch=got.epoch)
        return got

    def launched(self) -> None:
        """The window the lease was taken for runs (or was refused after all): the release follows its log."""
        self.pending = None
        self._wake.set()

    def window_closed(self) -> None:
        self._wake.set()

    def status(self) -> dict:
        return {**self.shipper.lag(), "lease": self.lease, "lease_error": self.lease_error}

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.shipper.run)
            tg.start_soon(self._reconcile_forever)
            tg.start_soon(self._campaigns_forever)

    async def _reconcile_forever(self) -> None:
        while True:
            wake = self._wake = anyio.Event()
            try:
                await self.reconcile()
                self.lease_error = None
            except Exception as exc:  # noqa: BLE001 - the lease waits in the database; the window never waits on it
                if self.lease_error is None:
                    self.log.warning("fleet lease not reconciled", host=self.cfg.host, error=one_line(exc))
                self.lease_error = one_line(exc)
            with anyio.move_on_after(RECONCILE_S):
                await wake.wait()

    async def reconcile(self) -> None:
        """Releases this host's lease once its window's log records a verified restoration, or marks it
        for a person when the window closed without one; leaves it alone while the window runs. Each change
        commits as it is made (autocommit), so a release the journal says happened did."""
        async with await connect(self.dsn, autocommit=True) as conn:
            held = await lease.held(conn, self.cfg.host)
            await self._reassert(conn, held)
            if held is not None and held["state"] == "held" and held["window_id"] not in (self.running(), self.pending):
                end = await anyio.to_thread.run_sync(quiet(window_end), self.db, held["window_id"])
                if not end["opened"]:
                    # its start was refused after the lease was granted: nothing on the host changed
                    await lease.release(conn, self.cfg.host, CALLER, "the window never opened",
                                        window_id=held["window_id"])
                elif end["closed"] and end["verified"]:
                    await lease.release(conn, self.cfg.host, CALLER, "restoration verified and readmitted",
                                        window_id=held["window_id"])
                    self.log.info("fleet lease released", pool=self.cfg.pool, host=self.cfg.host,
                                  window_id=held["window_id"])
                elif end["closed"]:
                    await lease.needs_person(conn, self.cfg.host, held["window_id"], CALLER,
                                             "the window closed with its restoration not verified")
                    self.log.error("fleet lease kept for a person: the restoration did not verify",
                                   pool=self.cfg.pool, host=self.cfg.host, window_id=held["window_id"])
                held = await lease.held(conn, self.cfg.host)
            self.lease = held
            if self.campaigns:
                running = [w for w in (self.running(), self.pending) if w]
                await campaigns.renew(conn, self.cfg.host, running, self.claiming)  # the claims still this daemon's
                await self._adopt_runs(conn)
                await self._finish_runs(conn)

    async def _reassert(self, conn, held: dict | None) -> None:
        """The running window's lease, read back: still its own under the epoch it was granted. One that
        is gone or another's (released by hand, or granted again since) aborts the window, which
        restores: a primary out of rotation without its pool's lease is over the pool's limit."""
        running = self.running()
        if running is None:
            return
        epoch = self.granted.get(running)
        if epoch is None:
            epoch = await anyio.to_thread.run_sync(quiet(granted_epoch), self.db, running)
            if epoch is None:
                return  # a window opened without a lease (before this host joined a pool): nothing to hold it to
            self.granted[running] = epoch
        why = await lease.reassert(conn, self.cfg.host, running, epoch)
        if why is not None:
            self.log.error("fleet lease lost while the window runs: aborting it", host=self.cfg.host,
                           window_id=running, epoch=epoch, error=why)
            self.lease_lost(running, why)

    async def _adopt_runs(self, conn) -> None:
        """Runs the database still has claimed or queued whose window the local log says started: marked
        running under that window (the mark was lost, or the claim expired while the daemon was down),
        so that they are finished from the log, never started a second time."""
        unmarked = [r for r in await campaigns.unmarked(conn, self.cfg.host) if r[:2] != self.claiming]
        if not unmarked:
            return
        known = await anyio.to_thread.run_sync(quiet(campaign_windows), self.db)
        for campaign, run, claim_us in unmarked:
            wid = known.get((campaign, run, claim_us))
            if wid is not None:
                await campaigns.adopt(conn, campaign, run, claim_us, wid)
                self.log.info("campaign run found in the local log", host=self.cfg.host, campaign=campaign, run=run,
                              window_id=wid)

    async def _finish_runs(self, conn) -> None:
        """Campaign runs of this host whose windows have closed, marked done from the local log."""
        for wid in await campaigns.running(conn, self.cfg.host):
            if wid in (self.running(), self.pending):
                continue
            end = await anyio.to_thread.run_sync(quiet(window_end), self.db, wid)
            if end["closed"] or not end["opened"]:
                await campaigns.finish(conn, wid, end["outcome"], end["verdict"], end["verified"])
                self.log.info("campaign run done", host=self.cfg.host, window_id=wid, outcome=end["outcome"])

    async def _campaigns_forever(self) -> None:
        """Claims this host's queued runs while no window runs: woken by NOTIFY, or every CAMPAIGN_POLL_S."""
        quiet = False
        while True:
            try:
                async with await connect(self.dsn, autocommit=True) as listen:
                    await listen.execute("LISTEN flare_diag_runs")
                    self.campaigns = True
                    quiet = False
                    while True:
                        busy = await self._claim_and_start()
                        if busy:  # the pool is full: its requeue notifies us at once, so wait it out
                            await anyio.sleep(CAMPAIGN_BUSY_S)
                        async for _note in listen.notifies(timeout=CAMPAIGN_POLL_S, stop_after=1):
                            pass
            except Exception as exc:  # noqa: BLE001 - campaigns wait in the database; no window waits on them
                if not quiet:
                    self.log.warning("fleet campaigns not followed", host=self.cfg.host, error=one_line(exc))
                    quiet = True
                await anyio.sleep(CAMPAIGN_POLL_S)

    async def _claim_and_start(self) -> bool:
        """Starts this host's next queued run if the daemon is idle; True when the pool was full."""
        if self.starter is None or not self.idle() or self.pending is not None:
            return False
        # autocommit: each step (an adoption, the claim, the mark) commits as it is made. In one implicit
        # transaction the claim waited, uncommitted, for the start's mark; a failover between them lost it
        # and the run was claimed and run again
        async with await connect(self.dsn, autocommit=True) as conn:
            await self._adopt_runs(conn)  # a run the log says started is never claimed again
            run = await campaigns.claim(conn, self.cfg.host)
            if run is None:
                return False
            self.claiming = (run.campaign, run.run)
            try:
                return await self._start_claimed(conn, run)
            finally:
                self.claiming = None

    async def _start_claimed(self, conn, run: campaigns.Run) -> bool:
        """Starts a claimed run and marks what came of it; True when the pool was full."""
        if hashlib.sha256(run.plan_toml.encode()).hexdigest() != run.plan_sha256:
            await campaigns.mark(conn, run, "refused", detail="the plan's content does not match its sha256")
            return False
        assert self.starter is not None  # _claim_and_start claims nothing without one
        reply = await self.starter(run)
        if reply.get("ok"):
            await campaigns.mark(conn, run, "running", reply["window_id"])
            self.log.info("campaign run started", host=self.cfg.host, campaign=run.campaign, run=run.run,
                          window_id=reply["window_id"])
            return False
        if campaigns.requeue_after(reply):  # a full pool or a database that did not answer: for later
            await campaigns.mark(conn, run, "queued", detail=reply.get("error", ""))
            self.log.info("campaign run requeued", host=self.cfg.host, campaign=run.campaign, run=run.run,
                          why=reply.get("code"))
            return True
        await campaigns.mark(conn, run, "refused", detail=reply.get("error", ""))
        self.log.warning("campaign run refused", host=self.cfg.host, campaign=run.campaign, run=run.run,
                         error=reply.get("error"))
        return False
