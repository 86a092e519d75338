"""Setting a window up: plan, site and fixtures read and checked, the opening input built; nothing runs."""

from __future__ import annotations

import functools
import hashlib
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from daemon.fixture import Fixture, FixtureError, find_fixture, load_fixture
from daemon.nvml import available as nvml_unavailable
from daemon.site import Site, SiteError, load_site
from events.schema import WindowOpened
from policies.plan import Plan, PlanError, decode_plan
from policies.planner import Calibration


POLICIES = Path(__file__).resolve().parent.parent / "policies"


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

    @property
    def plan_sha256(self) -> str:
        return self.recorded_plan_sha256 or hashlib.sha256(self.plan_raw).hexdigest()

    def opened(self, window_id: str) -> WindowOpened:
        return WindowOpened(at_ns=0, window_id=window_id, plan=msgspec.to_builtins(self.plan),
                            plan_sha256=self.plan_sha256, site=self.site.name,
                            gpu_source=self.site.profile.gpu.source, rehearsal=self.rehearsal,
                            candidate_recipe=self.site.candidate_recipe,
                            time_scale=self.time_scale, site_profile=self.site_profile,
                            fixture_dirs=self.fixture_dirs,
                            calibration=msgspec.to_builtins(self.calibration) if self.calibration else {},
                            policy_sha256=policy_version(), site_profile_sha256=self.site.sha256,
                            site_profile_toml=self.site.profile_toml,
                            fixtures_sha256={n: fixture_digest(f) for n, f in sorted(self.fixtures.items())})


def new_window_id(plan: Plan) -> str:
    return f"{plan.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}"


def read_plan(path: Path) -> tuple[bytes, Plan]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read plan ({exc.strerror})") from None
    try:
        return raw, decode_plan(raw, str(path))
    except PlanError as exc:
        raise InputError(str(exc)) from None


def load_fixtures(plan: Plan, search: list[Path]) -> dict[str, Fixture]:
    try:
        return {f.name: load_fixture(find_fixture(f.name, search)) for f in plan.fixtures}
    except FixtureError as exc:
        raise InputError(str(exc)) from None


def setup_for_site(plan_path: Path, site_path: Path, time_scale: float = 1.0) -> WindowSetup:
    """Everything a window against a site needs, checked before anything starts."""
    if not time_scale > 0:
        raise InputError(f"time_scale {time_scale}: expected a positive factor")
    plan_raw, plan = read_plan(plan_path)
    try:
        site = load_site(site_path)
    except SiteError as exc:
        raise InputError(str(exc)) from None
    if plan.production and site.profile.gpu.source == "none":
        # Xid and OOM are abort rules of every production window: a site that cannot watch its
        # GPUs cannot enforce them, so it does not get to run one
        raise InputError(f"{site_path}: gpu.source = \"none\": a production plan needs its GPUs watched "
                         f"(\"nvml\", or \"sim\" in rehearsal)")
    if plan.production and site.profile.gpu.source == "nvml" and (why := nvml_unavailable()):
        raise InputError(f"{plan_path}: a production plan needs NVML: {why}")
    dirs = [plan_path.parent.resolve(), site_path.parent.resolve()]
    return WindowSetup(plan_raw, plan, site, load_fixtures(plan, dirs), time_scale,
                       rehearsal=site.profile.gpu.source == "sim", site_profile=str(site_path.resolve()),
                       fixture_dirs=[str(d) for d in dirs], plan_path=str(plan_path))
