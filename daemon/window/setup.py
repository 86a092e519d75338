"""Setting a window up: plan, site and fixtures read and checked, the opening input built; nothing runs."""

from __future__ import annotations

import functools
import hashlib
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from flare_diag.daemon.hosts.fixture import sampling_mismatch, Fixture, FixtureError, find_fixture, load_fixture
from flare_diag.daemon.hosts.nvml import available as nvml_unavailable
from flare_diag.daemon.hosts.files import FileRefused, read_bounded
from flare_diag.daemon.hosts.site import Site, SiteError, load_site
from flare_diag.daemon.window.reviews import ReviewError, gate, reviews_in
from flare_diag.events.base import Event
from flare_diag.events.schema import WindowOpened
from flare_diag.policies.plan import MAX_PLAN_BYTES, Plan, PlanError, decode_plan
from flare_diag.policies.review import Review
from flare_diag.policies.scaling import time_scale_error
from flare_diag.policies.planner import Calibration
from flare_diag.resources import resource


POLICIES = resource("flare_diag.policies")


@functools.cache
def policy_version() -> str:
    """The digest of the pure policy's source: a daemon upgraded inside a window may decide differently."""
    h = hashlib.sha256()
    for f in sorted(POLICIES.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def fixture_digest(f: Fixture) -> str:
    return hashlib.sha256("".join(f.sha256).encode()).hexdigest()


class InputError(ValueError):
    """Something the operator supplied is wrong: one line naming it; nothing was started."""


@dataclass
class WindowSetup:
    plan_raw: bytes
    plan: Plan
    site: Site
    fixtures: dict[str, Fixture]
    time_scale: float = 1.0
    rehearsal: bool = False
    site_profile: str = ""
    fixture_dirs: list[str] = field(default_factory=list)
    recorded_plan_sha256: str = ""  # a recovered window keeps the digest it was opened with
    calibration: Calibration | None = None  # what the estimates start from besides the plan's rates
    accept_partial: bool = False  # run even when the forecast says a required cell does not fit
    plan_path: str = ""
    expected_incumbent: str = ""  # after a window that did not restore: the incumbent it recorded
    clock: str = "wall"  # "virtual" in a rehearsal on the simulator's time (daemon/rehearsal/virtualtime.py)
    sim_seed: int | None = None
    inprocess_sim: bool = False  # a rehearsal's own simulator, served in this process
    probes: list = field(default_factory=list)  # the probe's events, when no `probe_log` takes them as they happen
    # the log the probe's events go to as they happen (intent before each request, answer after); None:
    # they are kept in `probes` (a probe that only calibrates a scale, autoscale)
    probe_log: Callable[[Event], Awaitable[object]] | None = None
    review: dict = field(default_factory=dict)  # the review that let a production plan run (by, note, seq, hash)
    preconditions: list = field(default_factory=list)  # events logged before the window opens (harness, preserved)
    earlier: tuple[Path, str | None] | None = None  # an earlier window of the site (its log, its id; None: the last)

    async def log_probe(self, ev: Event) -> None:
        if self.probe_log is not None:
            await self.probe_log(ev)
        else:
            self.probes.append(ev)

    @property
    def plan_sha256(self) -> str:
        return self.recorded_plan_sha256 or hashlib.sha256(self.plan_raw).hexdigest()

    def opened(self, window_id: str) -> WindowOpened:
        from flare_diag.daemon.hosts.profile_rules import reuse_identity, startup_requests  # the site's engine, asked in hosts/
        most, each = startup_requests(self.site)
        return WindowOpened(at_ns=0, window_id=window_id, plan=msgspec.to_builtins(self.plan),
                            plan_sha256=self.plan_sha256, site=self.site.name,
                            gpu_source=self.site.profile.gpu.source, rehearsal=self.rehearsal,
                            candidate_recipe=self.site.candidate_recipe,
                            time_scale=self.time_scale, site_profile=self.site_profile,
                            fixture_dirs=self.fixture_dirs,
                            calibration=msgspec.to_builtins(self.calibration) if self.calibration else {},
                            policy_sha256=policy_version(), site_profile_sha256=self.site.sha256,
                            site_profile_toml=self.site.profile_toml,
                            fixtures_sha256={n: fixture_digest(f) for n, f in sorted(self.fixtures.items())},
                            expected_incumbent_sha256=self.expected_incumbent, clock=self.clock,
                            sim_seed=self.sim_seed, review=self.review,
                            steady_state=bool(self.plan.guards) and self.site.profile.steady_state is not None,
                            reuse_identity=reuse_identity(self.site), startup_requests=most,
                            startup_generated_each=each)


def new_window_id(plan: Plan) -> str:
    return f"{plan.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}"


def read_plan(path: Path) -> tuple[bytes, Plan]:
    try:
        raw = read_bounded(path, "the plan", MAX_PLAN_BYTES)
    except FileRefused as exc:
        raise InputError(str(exc)) from None
    try:
        return raw, decode_plan(raw, str(path))
    except PlanError as exc:
        raise InputError(str(exc)) from None


def load_fixtures(plan: Plan, search: list[Path]) -> dict[str, Fixture]:
    """The plan's fixtures, each verified against its manifest and, body by body, against the plan's
    sampling (contract section 2): a body that differs is refused before anything changes."""
    try:
        fixtures = {f.name: load_fixture(find_fixture(f.name, search)) for f in plan.fixtures}
    except FixtureError as exc:
        raise InputError(str(exc)) from None
    for ref in plan.fixtures:
        want = plan_sampling(plan, ref.name)
        why = sampling_mismatch(fixtures[ref.name], want)
        if why:
            raise InputError(f"fixture {ref.name}: {why}; every body must ask the plan's sampling (contract section 2)")
    return fixtures


def plan_sampling(plan: Plan, fixture: str) -> dict:
    """The sampling every body of `fixture` must ask: the plan's, with the fixture's own max_tokens,
    temperature and reasoning effort where the plan states them (the trace fixture, a greedy fixture)."""
    sp = msgspec.to_builtins(plan.sampling)
    ref = next((f for f in plan.fixtures if f.name == fixture), None)
    if ref is not None and ref.max_tokens is not None:
        sp["max_tokens"] = ref.max_tokens
    if ref is not None and ref.temperature is not None:
        sp["temperature"] = ref.temperature
    if ref is not None and ref.reasoning_effort is not None:
        sp["reasoning_effort"] = ref.reasoning_effort
    return sp


SITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def site_in(sites_dir: Path, name: str) -> Path:
    """The profile a site name stands for: `NAME.toml` in the operator's sites directory, nothing else."""
    if not SITE_NAME.fullmatch(name) or name.endswith(".toml"):
        if "/" in name or name.endswith(".toml"):  # the same words whatever the path: nothing about the caller's files
            raise InputError(f"site {name[:80]!r}: expected the name of a site profile in the daemon's sites directory, "
                             f"not a path: the daemon reads profiles only from {sites_dir} (so that no caller can point "
                             f"its tokens elsewhere); install the profile there as NAME.toml and pass --site NAME")
        raise InputError(f"site {name[:80]!r}: expected the name of a site profile in the daemon's sites "
                         f"directory (letters, digits, '.', '_', '-'; not a path)")
    path = sites_dir / f"{name}.toml"
    if not path.is_file():
        raise InputError(f"site {name!r}: no such site in the daemon's sites directory {sites_dir}")
    return path


def check_review(setup: WindowSetup, reviews: list[Review] | None, where: str) -> None:
    """A production plan's review of exactly its bytes by someone else, recorded on the setup; InputError
    (nothing changed) when there is none. `reviews` None: no review log was named."""
    plan = setup.plan
    if not plan.production:
        return
    if reviews is None:
        raise InputError(f"{setup.plan_path or 'plan'}: a production plan needs a recorded review of its exact bytes: "
                         f"give --reviews LOG (a log that `flare-diag review sign PLAN --by NAME --log LOG` wrote)")
    try:
        r = gate(setup.plan_raw, plan.author, setup.fixtures, reviews, where)
    except ReviewError as exc:
        raise InputError(f"{setup.plan_path or 'plan'}: {exc}") from None
    setup.review = {"by": r.by, "note": r.note, "seq": r.seq, "hash": r.hash, "log": where}


def setup_for_start(plan_raw: bytes, plan_label: str, site_name: str, sites_dir: Path,
                    time_scale: float = 1.0, caller_fixtures: dict[str, str] | None = None) -> WindowSetup:
    """A window started over the control socket: the plan as the caller sent it, the site and its
    fixtures from the operator's sites directory (or built in). A fixture the daemon cannot find
    that the caller has beside the plan is refused naming the caller's folder and why."""
    try:
        plan = decode_plan(plan_raw, plan_label or "plan")
    except PlanError as exc:
        raise InputError(str(exc)) from None
    for f in plan.fixtures:
        theirs = (caller_fixtures or {}).get(f.name)
        if theirs is None:
            continue
        try:
            find_fixture(f.name, [sites_dir.resolve()])
        except FixtureError:
            raise InputError(f"fixture {f.name!r}: the plan's copy is at {theirs[:300]}, a folder the daemon does not "
                             f"read (it reads fixtures only from its sites directory {sites_dir} and its built-ins, and "
                             f"under systemd ProtectHome hides /home); install the fixture as {sites_dir}/{f.name}") from None
    setup = _setup(plan_raw, plan, site_in(sites_dir, site_name), [sites_dir.resolve()], time_scale,
                   plan_label or "plan")
    setup.plan_path = plan_label
    return setup


def setup_for_site(plan_path: Path, site_path: Path, time_scale: float = 1.0, reviews_log: Path | None = None) -> WindowSetup:
    """Everything a foreground window against a site needs (files the caller can read), checked
    before anything starts: a production plan's review in `reviews_log` among them."""
    plan_raw, plan = read_plan(plan_path)
    setup = _setup(plan_raw, plan, site_path, [plan_path.parent.resolve(), site_path.parent.resolve()], time_scale,
                   str(plan_path))
    setup.plan_path = str(plan_path)
    if plan.production:
        try:
            reviews = reviews_in(reviews_log) if reviews_log is not None else None
        except ReviewError as exc:
            raise InputError(f"--reviews {exc}") from None
        check_review(setup, reviews, str(reviews_log))
    return setup


def _setup(plan_raw: bytes, plan: Plan, site_path: Path, dirs: list[Path], time_scale: float,
           plan_label: str) -> WindowSetup:
    bad = time_scale_error(plan, time_scale)
    if bad:
        raise InputError(bad)
    try:
        site = load_site(site_path)
    except SiteError as exc:
        raise InputError(str(exc)) from None
    if time_scale != 1 and not site.simulated:
        # the clock belongs to the site: a scaled clock shrinks (or stretches) every deadline, the
        # watch-lost bound and the window itself, which only a simulated host may be run under
        raise InputError(f"time_scale {time_scale:g}: only a simulated site (gpu.source = \"sim\") runs on a scaled "
                         f"clock; site {site.name} is not one, so its window runs on the wall clock (time scale 1)")
    if plan.production and not site.gpus_watched:
        # Xid and OOM are abort rules of every production window: a site that cannot watch its
        # GPUs cannot enforce them, so it does not get to run one
        raise InputError(f"{site_path}: gpu.source = \"none\": a production plan needs its GPUs watched "
                         f"(\"nvml\", or \"sim\" in rehearsal)")
    if plan.production and site.gpus_through_nvml and (why := nvml_unavailable()):
        raise InputError(f"{plan_label}: a production plan needs NVML: {why}")
    return WindowSetup(plan_raw, plan, site, load_fixtures(plan, dirs), time_scale,
                       rehearsal=site.simulated, site_profile=str(site_path.resolve()),
                       fixture_dirs=[str(d) for d in dirs])
