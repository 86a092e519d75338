"""Rehearsal mechanics: flaresim served in process or as a process, and faults injected into it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
import re
import subprocess
import tempfile
import sys

from typing import TYPE_CHECKING

from flare_diag.daemon.rehearsal.inprocess import serve_in_process
from flare_diag.daemon.hosts.site import Site, sim_site
from flare_diag.daemon.window.setup import InputError

if TYPE_CHECKING:
    from flare_diag.fixtures.flaresim.host import Host

SIM_TOKEN_BYTES = 16


MOMENTS = ("request", "after_request", "after_s", "before_load", "after_load")
LOADS = ("before_load", "after_load")
FAULT_SPEC = "KIND[@PHASE#N|@request=N|@after_request=N|@after_s=X|@before_load=N|@after_load=N][,param=value]"
PHASE_REQUEST = re.compile(r"([A-Za-z0-9_.-]+)#([0-9]+)")


def parse_fault(spec: str) -> dict:
    """'kind' (now), 'kind@PHASE#N' (as the window sends PHASE's request #N: its order in the phase, from 0,
    as the report's request table and every abort and cell reason number it),
    'kind@request=N' / 'kind@after_request=N' (the host's N-th chat request from now, probes and
    preflights counted, arriving / answered), 'kind@after_s=X', 'kind@before_load=N' / 'kind@after_load=N'
    (as the N-th manager load from now begins / completes); extra ',key=value' params allowed.

    Checked whole before the simulator starts, so a bad spec starts nothing (a phase's name against
    the plan: `fault_phase_error`)."""
    from flare_diag.daemon.simulator import FAULT_KINDS, REQUEST_FAULTS  # the simulator owns its faults
    first, *params = spec.split(",")
    kind, _, at = first.partition("@")
    if kind not in FAULT_KINDS:
        raise InputError(f"--fault {spec!r}: kind: expected one of {', '.join(FAULT_KINDS)}")
    moment = at.partition("=")[0]
    if "@" in first and not at:
        raise InputError(f"--fault {spec!r}: @: expected a moment after it, one of @PHASE#N, "
                         f"{', '.join('@' + m for m in MOMENTS)} ({FAULT_SPEC})")
    if moment == "load":
        raise InputError(f"--fault {spec!r}: @load: expected @after_load=N (as the load completes, on the new "
                         f"incarnation) or @before_load=N (as it begins, before anything is loaded) ({FAULT_SPEC})")
    if moment in LOADS and kind in REQUEST_FAULTS:
        raise InputError(f"--fault {spec!r}: {kind} is met by a request, so it fires at @PHASE#N, @request, "
                         f"@after_request or @after_s, never @{moment} ({FAULT_SPEC})")
    out: dict = {"kind": kind, "at": "now", "spec": spec}
    if "#" in at:
        m = PHASE_REQUEST.fullmatch(at)
        if m is None:
            raise InputError(f"--fault {spec!r}: @{at}: expected PHASE#N, a phase of the plan and a request's order "
                             f"in it from 0 (as the report numbers them), such as B.forward_replay#12 ({FAULT_SPEC})")
        out["at"] = {"phase": m.group(1), "request": int(m.group(2))}
        at = ""
    elif at and moment not in MOMENTS:
        raise InputError(f"--fault {spec!r}: @{moment}: expected a moment, one of @PHASE#N, "
                         f"{', '.join('@' + m for m in MOMENTS)} ({FAULT_SPEC})")
    return _fault_params(spec, kind, at, params, out)


def _fault_params(spec: str, kind: str, at: str, params: list[str], out: dict) -> dict:
    """The moment's value and the fault's own parameters, each checked."""
    from flare_diag.daemon.simulator import NUMERIC_PARAMS, STRING_PARAMS, describe
    for i, part in enumerate(filter(None, [at, *params])):
        k, _, v = part.partition("=")
        if i == 0 and at:
            pass  # the moment, checked above
        elif k in MOMENTS or k not in {**NUMERIC_PARAMS.get(kind, {}), **dict.fromkeys(STRING_PARAMS.get(kind, ()))}:
            known = sorted([*NUMERIC_PARAMS.get(kind, {}), *STRING_PARAMS.get(kind, ())])
            raise InputError(f"--fault {spec!r}: {k!r}: {kind} takes " + (f"the parameters {', '.join(known)}"
                             if known else "no parameter") + f" ({FAULT_SPEC})")
        conv: Callable[[str], object]
        if k in ("request", "after_request", *LOADS):
            want, check, conv = "a whole number >= 0", lambda x: x >= 0, int
        elif k == "after_s":
            want, check, conv = "seconds >= 0", lambda x: 0 <= x < 1e9, float
        elif k in NUMERIC_PARAMS.get(kind, {}):
            want, check, conv = describe(NUMERIC_PARAMS[kind][k]), NUMERIC_PARAMS[kind][k], float
        else:
            want, check, conv = "a value", lambda x: bool(x) and x.isprintable(), str
        try:
            x = conv(v)
            ok = bool(v) and check(x)
        except (ValueError, OverflowError):
            ok = False
        if not ok:
            raise InputError(f"--fault {spec!r}: {k or part!r}: expected {want} ({FAULT_SPEC})")
        if k in MOMENTS:
            out["at"] = {k: x}
        else:
            out[k] = x
    return out


def fault_phase_error(faults: list[dict], phases: list[str]) -> str | None:
    """Why a fault bound to a phase's request cannot fire in this plan (a phase it lacks), or None."""
    for f in faults:
        at = f["at"]
        if isinstance(at, dict) and "phase" in at and at["phase"] not in phases:
            return (f"--fault {f['spec']!r}: phase {at['phase']!r}: expected one of the plan's phases "
                    f"({', '.join(phases)})")
    return None


def start_sim(scenario: str, time_scale: float, token: str) -> tuple[subprocess.Popen, str]:
    """flaresim as a child process; returns once it listens, with its base URL."""
    # stderr goes to a file, not a pipe nobody drains: a chatty simulator must never block on it
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-m", "flare_diag.fixtures.flaresim.serve", "--port", "0", "--scenario", scenario,
                             "--time-scale", str(time_scale), "--token", token],
                            stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if "listening on" not in line:
        proc.kill()
        proc.wait()
        err.seek(0)
        text = err.read().strip()
        raise InputError(f"flaresim did not start: {text.splitlines()[-1] if text else line.strip()}")
    return proc, line.split()[3]


SIM_URL = "http://flaresim.rehearsal"  # the in-process simulator's name: no socket, no port


@asynccontextmanager
async def served_flaresim(scenario: str, token: str, time_scale: float = 1.0, seed: int = 0,
                          candidate: str = "glm-candidate") -> AsyncIterator[tuple[Host, Site]]:
    """flaresim served in this process on the running loop's clock (virtual on a VirtualTimeLoop), and
    the site that reaches it: (its Host, the Site). The one place the daemon serves the simulator,
    as a rehearsal's host."""
    from flare_diag.daemon.simulator import Host, ScenarioError, build_app, load_scenario
    try:
        sc = load_scenario(scenario)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    host = Host(sc, time_scale=time_scale, token=token, clock=asyncio.get_running_loop().time, seed=seed)
    async with serve_in_process(build_app(host)) as transport:
        yield host, sim_site(SIM_URL, token, candidate=candidate, transport=transport)
