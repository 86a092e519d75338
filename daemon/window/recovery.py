"""Picking up a window left open: what the log recorded, the files it opened with, and what changed since."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import msgspec

from flare_diag.daemon.hosts.site import SiteError, load_site, site_from_bytes
from flare_diag.daemon.window.setup import InputError, WindowSetup, fixture_digest, load_fixtures, policy_version
from flare_diag.events.base import Event
from flare_diag.events.reader import LogReader
from flare_diag.events.schema import ActionRequested, Input, WindowClosed, WindowOpened
from flare_diag.policies.plan import PlanError, plan_from_builtins
from flare_diag.policies.planner import Calibration

@dataclass
class Unfinished:
    window_id: str
    opened_wall_ns: int
    opened: WindowOpened
    events: list[tuple[int, Event]]  # (seq, event) of the window, inputs and decisions, in log order

    @property
    def inputs(self) -> list[Input]:
        return [ev for _seq, ev in self.events if isinstance(ev, Input)]


def open_window_ids(db: Path) -> list[str]:
    """Windows opened in the log and never closed."""
    with LogReader(db) as r:
        opened = [e.window_id for e in r.iter(types=["window_opened"])]
        closed = {e.window_id for e in r.iter(types=["window_closed"])}
    return [w for w in opened if w not in closed]


def unfinished_windows(db: Path) -> list[Unfinished]:
    out = []
    open_ids = open_window_ids(db)
    with LogReader(db) as r:
        for wid in open_ids:
            envs = list(r.iter(window_id=wid))
            opened_env = next(e for e in envs if e.type == "window_opened")
            events = [(e.seq, e.event()) for e in envs]
            opened = next(ev for _s, ev in events if isinstance(ev, WindowOpened))
            out.append(Unfinished(wid, opened_env.wall_ns, opened, events))
    return out


def setup_for_recovery(opened: WindowOpened) -> tuple[WindowSetup, list[str]]:
    """The setup of an unfinished window, rebuilt from its opening input, and what differs from it now.

    The site profile is the one the window opened with (recorded in `window_opened`); a file changed
    or removed since is named among the mismatches and not used. Fixtures that can no longer be found
    are left out: the restore path sends no replayed body.
    """
    mismatches: list[str] = []
    try:
        plan = plan_from_builtins(opened.plan, "recorded plan")
    except PlanError as exc:
        raise InputError(str(exc)) from None
    if opened.policy_sha256 and opened.policy_sha256 != policy_version():
        mismatches.append(f"policy version {policy_version()[:12]} is not the {opened.policy_sha256[:12]} "
                          f"the window opened with (the daemon was upgraded inside the window)")
    path = Path(opened.site_profile)
    try:
        now_sha = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        now_sha = f"unreadable ({exc.strerror})"
    try:
        if opened.site_profile_toml:
            site = site_from_bytes(opened.site_profile_toml.encode(), path)
            if now_sha != opened.site_profile_sha256:
                mismatches.append(f"site profile {path} changed since the window opened "
                                  f"(sha256 {opened.site_profile_sha256[:12]} then, {now_sha[:12]} now); "
                                  f"restoring with the profile as recorded")
        else:  # a log from before profiles were recorded
            site = load_site(path)
    except SiteError as exc:
        raise InputError(str(exc)) from None
    try:
        fixtures = load_fixtures(plan, [Path(d) for d in opened.fixture_dirs])
    except InputError as exc:
        fixtures = {}
        mismatches.append(f"fixtures no longer load ({exc}); the restore sends no replayed body")
    for name, digest in sorted(opened.fixtures_sha256.items()):
        f = fixtures.get(name)
        if f is not None and fixture_digest(f) != digest:
            mismatches.append(f"fixture {name!r} changed since the window opened")
    setup = WindowSetup(b"", plan, site, fixtures, opened.time_scale, opened.rehearsal, opened.site_profile,
                        list(opened.fixture_dirs), opened.plan_sha256,
                        msgspec.convert(opened.calibration, Calibration) if opened.calibration else None)
    return setup, mismatches


def unrestored_incumbent(db: Path) -> str:
    """The incumbent's sha256 when the last window in the log closed without a verified restore
    (a person has to put it back, and nothing else may be taken for the incumbent); else ""."""
    with LogReader(db) as r:
        closed = list(r.iter(types=["window_closed"]))
        last = closed[-1].event() if closed else None
        if not isinstance(last, WindowClosed) or last.outcome != "restore_failed":
            return ""
        for env in r.iter(window_id=closed[-1].window_id, types=["action_requested"]):
            ev = env.event()
            if isinstance(ev, ActionRequested) and ev.action == "retain_recipe" and ev.args.get("role") == "incumbent":
                return str(ev.args.get("expect_sha256") or "")
    return ""
