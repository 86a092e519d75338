"""The offline harness validated on a window's own plan and fixture bytes, before any host change.

The seed: "validate existing offline harness and new HTTP-only replay fixture". Before `run` or
`start` changes anything, the same plan and fixture bytes are rehearsed against the embedded
simulator in virtual time (seconds, in a worker thread with a virtual-time loop of its own). Its
outcome, its log's head and its forecast become a precondition of the window, logged before it opens;
a plan the harness cannot complete is refused (a partial one only with --accept-partial).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import msgspec

from flare_diag.daemon.window.reviews import subject
from flare_diag.daemon.window.setup import InputError, WindowSetup
from flare_diag.events.schema import HarnessRehearsed, PreservedChecked

SCENARIO = "flare-47581cca"  # the simulator's model of the incumbent build: the seed's own host


async def _rehearse(setup: WindowSetup, folder: Path, scenario: str = SCENARIO) -> dict:
    """The window's plan and fixtures against flaresim (`scenario`: a name or a TOML path) in this thread's
    virtual-time loop; its report."""
    import secrets

    import msgspec

    from flare_diag.daemon.rehearsal.rehearse import SIM_TOKEN_BYTES, served_flaresim
    from flare_diag.daemon.reports.publish import write_reports
    from flare_diag.daemon.window.forecast import planned
    from flare_diag.daemon.window.runner import Runner
    from flare_diag.daemon.window.setup import new_window_id
    from flare_diag.daemon.window.sitecheck import checked_target
    from flare_diag.events.store import EventStore
    # the steady-state guards watch the site's routed pool through its Prometheus, which the simulator
    # does not model: the harness rehearses the window's host path, every phase, rule and restore of it
    plan = msgspec.structs.replace(setup.plan, guards=[])
    async with served_flaresim(scenario, secrets.token_hex(SIM_TOKEN_BYTES)) as (_host, site):
        rs = WindowSetup(setup.plan_raw, plan, site, setup.fixtures, rehearsal=True, accept_partial=setup.accept_partial,
                         plan_path=setup.plan_path, clock="virtual", sim_seed=0, inprocess_sim=True)
        target = await checked_target(rs, folder / "recipes")
        try:
            sched = await planned(rs, target)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "forecast.json").write_bytes(msgspec.json.encode(sched) + b"\n")
            window_id = new_window_id(setup.plan)
            store = await EventStore.open(folder / "log.db", durable=False)
            try:
                await Runner(store, target, window_id, 1.0).run(rs.opened(window_id))
            finally:
                await store.close()
        finally:
            await target.close()
    return write_reports(folder / "log.db", window_id, folder)


@functools.cache
def build_digest() -> str:
    """This build's code that a rehearsal runs (the decider, the log, the shell, the simulator)."""
    import importlib.util
    h = hashlib.sha256()
    # located, not imported: the daemon reaches the simulator only through daemon/simulator.py
    roots = [Path(importlib.util.find_spec(name).submodule_search_locations[0])  # type: ignore[union-attr, index]  # our own packages: each has a spec and a folder
             for name in ("flare_diag.policies", "flare_diag.events", "flare_diag.daemon", "flare_diag.fixtures")]
    for root in roots:
        for f in sorted(root.rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def default_cache() -> Path:
    """Where a foreground `run` keeps validations: $FLARE_DIAG_HARNESS_CACHE, else
    $XDG_CACHE_HOME/flare-diag/harness (~/.cache by default)."""
    if os.environ.get("FLARE_DIAG_HARNESS_CACHE"):
        return Path(os.environ["FLARE_DIAG_HARNESS_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flare-diag" / "harness"


def harness_cache(state_dir: Path) -> Path:
    """Where the daemon keeps validations: $FLARE_DIAG_HARNESS_CACHE, else its state folder's harness/validated."""
    env = os.environ.get("FLARE_DIAG_HARNESS_CACHE")
    return Path(env) if env else state_dir / "harness" / "validated"


def _cache_key(setup: WindowSetup, scenario: str) -> str:
    plan_sha, manifests = subject(setup.plan_raw, setup.fixtures)
    where = Path(scenario)
    sc = hashlib.sha256(where.read_bytes()).hexdigest() if where.suffix == ".toml" else scenario
    return hashlib.sha256(json.dumps([plan_sha, manifests, setup.accept_partial, sc, build_digest()]).encode()).hexdigest()


def validated(setup: WindowSetup, folder: Path, cache: Path | None, scenario: str = SCENARIO,
              label: str = SCENARIO) -> HarnessRehearsed:
    """The harness's validation of these bytes by this build: the one already made (a virtual-time rehearsal
    of the same bytes by the same code decides alike, and its log is kept where it ran), or a new one."""
    key = _cache_key(setup, scenario)
    hit = cache / f"{key}.json" if cache is not None else None
    if hit is not None and hit.is_file():
        try:
            ev = msgspec.json.decode(hit.read_bytes(), type=HarnessRehearsed)
            if Path(ev.folder, "log.db").is_file():
                return ev
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            pass  # a damaged entry is made again
    ev = rehearse_harness(setup, folder, scenario, label)
    if hit is not None and ev.outcome in ("completed", "partial"):
        try:
            hit.parent.mkdir(parents=True, exist_ok=True)
            tmp = hit.with_suffix(".tmp")
            tmp.write_bytes(msgspec.json.encode(ev))
            tmp.replace(hit)
        except OSError:
            pass  # no cache where it cannot be written: the next window rehearses again
    return ev


def rehearse_harness(setup: WindowSetup, folder: Path, scenario: str = SCENARIO, label: str = SCENARIO) -> HarnessRehearsed:
    """Blocking (run it in a worker thread: it runs a virtual-time loop of its own): the rehearsal into
    `folder`, then the precondition it gives."""
    from flare_diag.daemon.rehearsal import virtualtime
    started = time.monotonic()
    try:
        report = virtualtime.run(_rehearse(setup, folder, scenario))
    except Exception as exc:  # noqa: BLE001 - a refusal may come wrapped by the simulator's task group
        refused = _refusal(exc)
        if refused is None:  # the harness itself broke: the window is refused all the same, saying so
            raise InputError(f"the offline harness failed on this plan ({type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:200]}); nothing on the host was changed") from None
        raise InputError(f"the offline harness could not complete this plan: it refused it before its rehearsal "
                         f"({refused})") from None
    plan_sha, manifests = subject(setup.plan_raw, setup.fixtures)
    forecast = ""
    if (folder / "forecast.json").is_file():
        f = json.loads((folder / "forecast.json").read_text())
        end = f.get("required_end_min") if isinstance(f, dict) else None
        forecast = f"the required cells end at minute {end:.1f}" if isinstance(end, (int, float)) else "no required cell fits"
    it = report.get("integrity") or {}
    return HarnessRehearsed(plan_sha256=plan_sha, fixtures=manifests, scenario=label, outcome=str(report.get("outcome")),
                            verdict=str((report.get("verdict") or {}).get("hypothesis")), log_head_seq=int(it.get("head_seq") or 0),
                            log_head_hash=str(it.get("head_hash") or ""), forecast=forecast,
                            wall_s=round(time.monotonic() - started, 3), folder=str(folder.resolve()))


def _refusal(exc: BaseException) -> InputError | None:
    """The InputError inside `exc` (itself, or in an exception group), or None."""
    if isinstance(exc, InputError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        if (found := _refusal(inner)) is not None:
            return found
    return None


FITTED = "fitted to window "  # how a rehearsal against the reproducer's fit of an earlier window names its scenario


def fitted(setup: WindowSetup, folder: Path, cache: Path | None, db: Path, window: str | None) -> HarnessRehearsed:
    """Blocking: the harness against the host-cache model the reproducer fits to an earlier window of the site
    (`db`, `window`; None: its last). Only the seed-pools family is a model the simulator serves (its rows pool
    at the fitted capacity); another family is said, not rehearsed (outcome `not_applicable`)."""
    from flare_diag.daemon.reproducer.fit import fit_window
    from flare_diag.daemon.reproducer.reproduce import ReproduceError
    from flare_diag.daemon.simulator import load_scenario
    plan_sha, manifests = subject(setup.plan_raw, setup.fixtures)
    base = load_scenario(SCENARIO)
    try:
        rep = fit_window(db, window, base)
    except ReproduceError as exc:
        return HarnessRehearsed(plan_sha256=plan_sha, fixtures=manifests, scenario=f"{FITTED}{window or '(last)'}",
                                outcome="not_applicable", verdict="", log_head_seq=0, log_head_hash="",
                                forecast=f"the reproducer cannot fit it ({' '.join(str(exc).split())[:160]})", wall_s=0.0)
    best = rep.best
    label = f"{FITTED}{rep.window_id}: {best.family} of {best.capacity} ({best.agreed} of {best.compared} requests agree)"
    if best.family != "seed_pools":
        return HarnessRehearsed(plan_sha256=plan_sha, fixtures=manifests, scenario=label, outcome="not_applicable",
                                verdict="", log_head_seq=0, log_head_hash="", wall_s=0.0,
                                forecast="the simulator serves no cache of this family, so it was not rehearsed")
    folder.mkdir(parents=True, exist_ok=True)
    sc = folder / "fitted-scenario.toml"
    sc.write_bytes(msgspec.toml.encode(msgspec.structs.replace(base, name=f"fitted-{rep.window_id}"[:120],
                                                               rows_capacity=max(1, best.capacity))))
    return validated(setup, folder, cache, str(sc), label)


def judge(ev: HarnessRehearsed, accept_partial: bool, folder: Path) -> None:
    """InputError (nothing changed) unless the harness completed the plan, or ended partial under --accept-partial
    (a fitted model the simulator cannot serve is `not_applicable`: said, never a refusal)."""
    if ev.outcome in ("completed", "not_applicable") or (ev.outcome == "partial" and accept_partial):
        return
    more = "" if ev.outcome != "partial" else " (give --accept-partial to run a plan that ends partial)"
    raise InputError(f"the offline harness could not complete this plan: its rehearsal against the embedded simulator "
                     f"ended {ev.outcome}{more}; see {folder / 'report.md'}")


async def preconditions(setup: WindowSetup, folder: Path, outputs: list[Path], base: Path | None,
                        cache: Path | None = None, earlier: tuple[Path, str | None] | None = None) -> None:
    """What a window on a site needs before anything on the host is read or changed: its preserved
    history hashed (relative paths against `base`, the plan's folder; None: absolute paths only), and
    (a production plan's) the offline harness rehearsed on its own plan and fixture bytes into `folder`;
    each an event in `setup.preconditions`, logged before the window opens. InputError refuses it."""
    from flare_diag.daemon.window.preserve import PreserveError, before, resolve
    if setup.inprocess_sim:  # `flare-diag rehearse` is the harness itself
        return
    if setup.plan.preserve.paths:
        try:
            setup.preconditions.append(await anyio.to_thread.run_sync(before, resolve(setup.plan.preserve.paths, base),
                                                                       outputs))
        except (PreserveError, OSError) as exc:
            raise InputError(str(exc)) from None
    if setup.plan.production:
        ev = await anyio.to_thread.run_sync(validated, setup, folder, cache)
        setup.preconditions.append(ev)
        judge(ev, setup.accept_partial, folder)
        if earlier is not None:  # the site has an earlier window: the model fitted to it, rehearsed too
            ev = await anyio.to_thread.run_sync(fitted, setup, folder.with_name(folder.name + "-fitted"), cache, *earlier)
            setup.preconditions.append(ev)
            judge(ev, setup.accept_partial, folder.with_name(folder.name + "-fitted"))


async def after_publishing(setup: WindowSetup, append: Callable[[PreservedChecked], Awaitable[object]]) -> bool:
    """The preserved history hashed again once the reports are out, handed to `append` (the window's
    log); False when the plan preserves nothing."""
    from flare_diag.daemon.window.preserve import after
    first = next((p for p in setup.preconditions if isinstance(p, PreservedChecked)), None)
    if first is None:
        return False
    await append(await anyio.to_thread.run_sync(after, first))
    return True
