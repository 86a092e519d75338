"""`rehearse --time-scale auto`: the fastest pace a live-paced rehearsal can keep on this machine now, from
a probe of the simulated incumbent, with headroom for a machine whose load rises during the window."""

from __future__ import annotations

import secrets
from pathlib import Path

import msgspec

from flare_diag.daemon.hosts.target import Target
from flare_diag.daemon.rehearsal.rehearse import SIM_TOKEN_BYTES, served_flaresim
from flare_diag.daemon.window.forecast import merged, probe, schedule
from flare_diag.daemon.window.setup import WindowSetup, load_fixtures
from flare_diag.policies.plan import Plan
from flare_diag.policies.planner import Calibration
from flare_diag.policies.scaling import max_time_scale

SCALES = (20.0, 15.0, 12.0, 10.0, 8.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0)
# On the wall clock the harness's own seconds a request (HTTP, parsing, each commit) are multiplied by the
# scale; a machine whose load doubles during the window doubles them. The scale is chosen so that the
# required cells would still fit then: at x20 on a machine with both cores busy the first demo ended partial.
HEADROOM = 2.0


async def auto_time_scale(plan_raw: bytes, plan: Plan, scenario: str, seed: int, candidate: str, plan_path: str,
                          calibration: Calibration | None) -> tuple[float, str]:
    """(the scale, one line saying how it was chosen): the largest of SCALES (never above what the plan's
    bounds allow) at which every required cell fits by the forecast with the harness HEADROOM times as
    slow as a probe at the top scale found it; x1 when none does."""
    top = next(s for s in SCALES if s <= max(1.0, max_time_scale(plan)))
    token = secrets.token_hex(SIM_TOKEN_BYTES)
    beside = [Path(plan_path).parent.resolve()] if plan_path else []
    async with served_flaresim(scenario, token, top, seed, candidate) as (_host, site):
        setup = WindowSetup(plan_raw, plan, site, load_fixtures(plan, beside), top, rehearsal=True, plan_path=plan_path,
                            clock="wall", sim_seed=seed, inprocess_sim=True)
        target = Target(site, setup.fixtures, setup.plan_sha256)
        try:
            probed = await probe(target, setup)  # its events stay in setup.probes: a scale is chosen, no window opens
        finally:
            await target.close()
    if probed is None or probed.overhead_s is None:
        return top, f"time scale x{top:g} (auto: the plan gave the probe nothing to send, so the top scale)"
    real_s = probed.overhead_s / top  # the harness's own real seconds a request, whatever the scale
    for scale in (s for s in SCALES if s <= top):
        cal = msgspec.structs.replace(probed, overhead_s=real_s * scale * HEADROOM, time_scale=scale)
        if schedule(setup, merged(calibration, cal)).fits:
            return scale, (f"time scale x{scale:g} (auto: the fastest of x{top:g} down at which every required cell "
                           f"fits with the harness {HEADROOM:g} times as slow as a probe found it, "
                           f"{real_s * 1000:.0f} ms a request)")
    return 1.0, (f"time scale x1 (auto: no faster scale fits the required cells with the harness {HEADROOM:g} times "
                 f"as slow as a probe found it, {real_s * 1000:.0f} ms a request)")
