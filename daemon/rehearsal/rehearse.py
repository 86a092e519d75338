"""Rehearsal mechanics: flaresim served in process or as a process, and faults injected into it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
import subprocess
import tempfile
import sys

import httpx

from flare_diag.daemon.rehearsal.inprocess import serve_in_process
from flare_diag.daemon.hosts.site import Site, sim_site
from flare_diag.daemon.window.setup import InputError

SIM_TOKEN_BYTES = 16


MOMENTS = ("request", "after_request", "after_s", "load")
FAULT_SPEC = "KIND[@request=N|@after_request=N|@after_s=X|@load=N][,param=value]"


def parse_fault(spec: str) -> dict:
    """'kind', 'kind@request=N', 'kind@after_request=N', 'kind@after_s=X' or 'kind@load=N' (extra ',key=value'
    params allowed; `load`: as the n-th manager load from now completes).

    Checked whole before the simulator starts, so a bad spec starts nothing."""
    from flare_diag.daemon.simulator import FAULT_KINDS, NUMERIC_PARAMS, REQUEST_FAULTS, STRING_PARAMS, describe  # the simulator owns its faults
    first, *params = spec.split(",")
    kind, _, at = first.partition("@")
    if kind not in FAULT_KINDS:
        raise InputError(f"--fault {spec!r}: kind: expected one of {', '.join(FAULT_KINDS)}")
    if "@" in first and not at:
        raise InputError(f"--fault {spec!r}: @: expected a moment after it, one of "
                         f"{', '.join('@' + m for m in MOMENTS)} ({FAULT_SPEC})")
    if at.partition("=")[0] == "load" and kind in REQUEST_FAULTS:
        raise InputError(f"--fault {spec!r}: {kind} is met by a request, so it fires at @request, @after_request or "
                         f"@after_s, never @load ({FAULT_SPEC})")
    if at and at.partition("=")[0] not in MOMENTS:
        raise InputError(f"--fault {spec!r}: @{at.partition('=')[0]}: expected a moment, one of "
                         f"{', '.join('@' + m for m in MOMENTS)} ({FAULT_SPEC})")
    out: dict = {"kind": kind, "at": "now"}
    for i, part in enumerate(filter(None, [at, *params])):
        k, _, v = part.partition("=")
        if i == 0 and at:
            pass  # the moment, checked above
        elif k in MOMENTS or k not in {**NUMERIC_PARAMS.get(kind, {}), **dict.fromkeys(STRING_PARAMS.get(kind, ()))}:
            known = sorted([*NUMERIC_PARAMS.get(kind, {}), *STRING_PARAMS.get(kind, ())])
            raise InputError(f"--fault {spec!r}: {k!r}: {kind} takes " + (f"the parameters {', '.join(known)}"
                             if known else "no parameter") + f" ({FAULT_SPEC})")
        if k in ("request", "after_request", "load"):
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
        if k in ("request", "after_request", "after_s", "load"):
            out["at"] = {k: x}
        else:
            out[k] = x
    return out


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


async def inject_faults(base: str, token: str, faults: list[dict], transport: httpx.AsyncBaseTransport | None = None) -> None:
    async with httpx.AsyncClient(transport=transport) as c:
        for f in faults:
            r = await c.post(f"{base}/sim/v1/faults", json=f, headers={"Authorization": f"Bearer {token}"})
            if r.status_code != 200:
                raise InputError(f"--fault {f['kind']}: {r.json().get('error', {}).get('message')}")


@asynccontextmanager
async def served_flaresim(scenario: str, token: str, time_scale: float = 1.0, seed: int = 0,
                          candidate: str = "glm-candidate") -> AsyncIterator[tuple[object, Site]]:
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
