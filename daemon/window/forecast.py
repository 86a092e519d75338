"""Forecasts before quiesce: the schedule a window would follow, its calibration, and the refusal."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec

from flare_diag.daemon.hosts.errors import classify_exception
from flare_diag.daemon.hosts.target import Target
from flare_diag.daemon.window.setup import InputError, WindowSetup
from flare_diag.events.reader import LogReader
from flare_diag.events.schema import ProbeRequest, ProbeSent
from flare_diag.events.sqlschema import NotAnEventLog
from flare_diag.policies.calibration import CalibrationError, calibrate
from flare_diag.policies.planner import Calibration, Estimator, Schedule, forecast, phase_requests, work_from

PROBE_REQUESTS = 4  # the first warms the connection and the host's tokenizer, and is not counted


def estimator(setup: WindowSetup, cal: Calibration | None = None) -> Estimator:
    fixtures = {name: f.work() for name, f in setup.fixtures.items()}
    return Estimator(setup.plan, work_from(setup.plan, fixtures), cal)


def schedule(setup: WindowSetup, cal: Calibration | None = None) -> Schedule:
    return forecast(setup.plan, estimator(setup, cal))


def load_calibration(path: Path) -> Calibration:
    """What the first window in an earlier log measured; InputError names the file otherwise."""
    if not path.is_file():
        raise InputError(f"--calibrate {path}: no such log")
    try:
        with LogReader(path) as reader:
            ids = reader.window_ids()
            if not ids:
                raise InputError(f"--calibrate {path}: the log holds no window")
            return calibrate((e.event() for e in reader.iter(window_id=ids[-1])), str(path))
    except NotAnEventLog as exc:
        raise InputError(f"--calibrate {exc}") from None
    except CalibrationError as exc:
        raise InputError(f"--calibrate {exc}") from None


def merged(base: Calibration | None, probe: Calibration | None) -> Calibration | None:
    """An earlier log's tokens per body, with a probe's pace and overhead when the log's were
    measured at another time scale (a rehearsal's overhead is its harness's latency times the scale)."""
    if base is None or probe is None:
        return base or probe
    if base.time_scale == probe.time_scale and base.overhead_s is not None:
        return base  # hundreds of the window's own rounds say more than a probe of three
    return msgspec.structs.replace(base, source=f"{base.source}; pace and overhead from {probe.source}", pace=probe.pace,
                                   overhead_s=probe.overhead_s, time_scale=probe.time_scale)


def refuse_unfit(sched: Schedule, plan_path: str, accept_partial: bool) -> None:
    """run, start and rehearse refuse a plan whose required cells do not fit (contract section 3)."""
    if sched.fits or accept_partial:
        return
    end = f", the required cells end at minute {sched.required_end_min:.1f}" if sched.required_end_min else ""
    raise InputError(f"{plan_path}: by the forecast (pace x{sched.pace:.2f} + {sched.overhead_s:.1f} s a request{', ' + sched.calibration if sched.calibration else ''})"
                     f" these required cells do not fit before the stop minute {sched.stop_min:g}: {', '.join(sched.unfit)}{end};"
                     f" see `flare-diag plan forecast`, or pass --accept-partial to run it anyway")


def probe_budget(setup: WindowSetup) -> int:
    """How many bodies the forecast may send before the window opens: a paced rehearsal probes its own
    in-process simulator; a site only when its profile opts in ([forecast] probe_requests), and never
    more than the plan allows (rates.probe_requests). In virtual time the harness adds no seconds to
    measure, so nothing is probed."""
    if setup.clock == "virtual":
        return 0
    wanted = PROBE_REQUESTS if setup.inprocess_sim else setup.site.profile.forecast.probe_requests
    return min(wanted, setup.plan.rates.probe_requests)


async def probe(target: Target, setup: WindowSetup) -> Calibration | None:
    """Pace and overhead from a few of the plan's own bodies sent before the window opens, each round
    timed on the window clock (real time times the scale) against the rate model with the tokens each
    body really used. Each request is logged (`setup.log_probe`) before it goes out, and its answer after."""
    n = probe_budget(setup)
    est = estimator(setup)
    ph = next((p for p in setup.plan.phases if p.kind == "replay" and p.fixture in setup.fixtures), None)
    if ph is None or n < 2:  # the first request warms up and is not counted: one alone measures nothing
        return None
    fixture = setup.fixtures[ph.fixture]  # type: ignore[index]  # a replay phase names its fixture

    def record(i: int, t0: float) -> dict:  # what every probe request's log entry says, answered or not
        return {"site": setup.site.name, "fixture": ph.fixture or "", "body_index": i, "body_sha256": fixture.sha256[i],
                "elapsed_s": round(anyio.current_time() - t0, 6)}

    for k, i in enumerate(phase_requests(ph, len(fixture.bodies))[:n]):
        await setup.log_probe(ProbeSent(site=setup.site.name, fixture=ph.fixture or "", body_index=i,
                                        body_sha256=fixture.sha256[i]))
        t0 = anyio.current_time()
        try:
            data = await target.send_request({"phase": "probe", "fixture": ph.fixture, "order_index": i, "body_index": i,
                                              "body_sha256": fixture.sha256[i]})
        except Exception as exc:  # a host that cannot answer a probe will not carry a window
            f = classify_exception(exc, "send_request")
            await setup.log_probe(ProbeRequest(**record(i, t0), outcome="error", error=f"{f.error}: {f.detail}"))
            raise InputError(f"{setup.site.name}: the forecast's probe request failed ({f.error}: {f.detail}); "
                             f"nothing was changed") from None
        await setup.log_probe(ProbeRequest(**record(i, t0), outcome="ok", prompt_tokens=data.get("prompt_tokens"),
                                           completion_tokens=data.get("completion_tokens")))
        await target.scrape_metrics({})
        actual = (anyio.current_time() - t0) * setup.time_scale
        if k == 0:
            continue
        est.observe_round(ph.fixture, [i], actual, {i: data.get("completion_tokens")}, {i: data.get("prompt_tokens")})  # type: ignore[arg-type]  # a replay phase names its fixture
    # only the pace and overhead carry over: the incumbent's tokens are not the candidate's
    learned = est.learned(f"probe of {est.rounds} requests at x{setup.time_scale:g}", setup.time_scale)
    return Calibration(source=learned.source, pace=learned.pace, overhead_s=learned.overhead_s, rounds=learned.rounds,
                       time_scale=setup.time_scale)


async def planned(setup: WindowSetup, target: Target) -> Schedule:
    """The forecast a window starts from, after the site check and before quiesce: the plan's rates,
    `--calibrate`, and a probe's pace where one is allowed (`probe_budget`). Refuses (InputError) a plan
    whose required cells do not fit unless the operator accepted a partial window;
    `setup.calibration` is what the window will start from; what the probe sent went to `setup.log_probe`
    as it was sent, whether the window then opens or not."""
    cal = setup.calibration
    if probe_budget(setup):
        cal = merged(cal, await probe(target, setup))
    setup.calibration = cal
    sched = schedule(setup, cal)
    refuse_unfit(sched, setup.plan_path or setup.plan.name, setup.accept_partial)
    if why := sched.stall_error():  # --accept-partial does not cover it: the bound would abort a healthy window
        raise InputError(f"{setup.plan_path or setup.plan.name}: {why}; nothing was changed")
    return sched
