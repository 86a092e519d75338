"""`flare-diag rehearse` and `flare-diag run`: one window in the foreground, reports written at the end."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import msgspec
from rich.console import Console

from daemon.fixture import FixtureError, find_fixture, load_fixture
from daemon.runner import Runner
from daemon.site import Site, sim_site
from daemon.target import Target
from events.checkpoint import default_path, read_checkpoint
from events.reader import LogReader
from events.report import project, render_json, render_md
from events.schema import CellRecorded, Decision, PhaseStarted, TimeMarked, VerdictReached, WindowClosed, WindowOpened
from events.store import EventStore
from events.verify import verify_log
from policies.plan import Plan

SIM_TOKEN_BYTES = 16


class InputError(ValueError):
    pass


def parse_fault(spec: str) -> dict:
    """'kind', 'kind@request=N' or 'kind@after_s=X' (extra ',key=value' params allowed)."""
    kind, _, rest = spec.partition("@")
    out: dict = {"kind": kind, "at": "now"}
    for part in filter(None, rest.split(",")):
        k, _, v = part.partition("=")
        if not v:
            raise InputError(f"--fault {spec!r}: expected KIND[@request=N|@after_s=X][,param=value]")
        if k == "request":
            out["at"] = {"request": int(v)}
        elif k == "after_s":
            out["at"] = {"after_s": float(v)}
        else:
            out[k] = float(v) if v.replace(".", "", 1).isdigit() else v
    return out


def start_sim(scenario: str, time_scale: float, token: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "fixtures.flaresim.serve", "--port", "0", "--scenario", scenario,
                             "--time-scale", str(time_scale), "--token", token],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(Path(__file__).resolve().parent.parent))
    line = proc.stdout.readline() if proc.stdout else ""
    if "listening on" not in line:
        err = proc.stderr.read() if proc.stderr else ""
        proc.kill()
        raise InputError(f"flaresim did not start: {err.strip().splitlines()[-1] if err.strip() else line.strip()}")
    return proc, line.split()[3]


def load_fixtures(plan: Plan, search: list[Path]) -> dict:
    try:
        return {f.name: load_fixture(find_fixture(f.name, search)) for f in plan.fixtures}
    except FixtureError as exc:
        raise InputError(str(exc)) from None


class Progress:
    def __init__(self, console: Console) -> None:
        self.c = console

    def __call__(self, d: Decision) -> None:
        if isinstance(d, PhaseStarted):
            self.c.print(f"[dim]minute {d.minute:6.1f}[/] phase [bold]{d.phase}[/] (estimated end minute {d.estimated_end_minute:.1f})")
        elif isinstance(d, CellRecorded):
            col = {"measured": "green", "failed": "red", "invalid": "yellow", "deferred": "blue"}[d.status]
            self.c.print(f"  [{col}]{d.status:>8}[/] {d.phase}: {d.reason}")
        elif isinstance(d, TimeMarked):
            self.c.print(f"[dim]minute {d.minute:6.1f}[/] {d.mark}")
        elif type(d).__name__ == "AbortDecided":
            self.c.print(f"[red bold]ABORT[/] {d.reason}: {d.detail}")  # type: ignore[attr-defined]
        elif isinstance(d, VerdictReached):
            self.c.print(f"verdict: [bold]{d.hypothesis}[/] — {d.basis}")
        elif isinstance(d, WindowClosed):
            self.c.print(f"window closed: [bold]{d.outcome}[/] at minute {d.minute}")


async def run_window(plan_raw: bytes, plan: Plan, site: Site, fixtures: dict, out: Path, time_scale: float,
                     rehearsal: bool, console: Console) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    db = out / "log.db"
    window_id = f"{plan.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    store = await EventStore.open(db)
    target = Target(site, fixtures, hashlib.sha256(plan_raw).hexdigest())
    runner = Runner(store, target, window_id, time_scale, on_decision=Progress(console))
    opened = WindowOpened(at_ns=0, window_id=window_id, plan=msgspec.to_builtins(plan),
                          plan_sha256=hashlib.sha256(plan_raw).hexdigest(), site=site.name,
                          gpu_source=site.profile.gpu.source, rehearsal=rehearsal,
                          candidate_recipe=site.profile.manager.candidate_recipe or "")
    try:
        await runner.run(opened)
    finally:
        await target.close()
        await store.close()
    return write_reports(db, window_id, out)


def write_reports(db: Path, window_id: str, out: Path) -> dict:
    from daemon.cli_log import audit_reader
    with LogReader(db) as reader:
        v = verify_log(reader, read_checkpoint(default_path(db)))
        a = audit_reader(reader)
        integrity = {"events": v.events, "head_seq": v.head_seq, "head_hash": v.head_hash, "chain_ok": v.ok, "audit_ok": a.ok}
        report = project(reader.iter(window_id=window_id), window_id, integrity)
    (out / "report.json").write_bytes(render_json(report))
    md = render_md(report)
    (out / "report.md").write_text(md)
    (out / "report.html").write_text(_html(md))
    return report


def _html(md: str) -> str:
    import html
    return ("<!doctype html><meta charset='utf-8'><title>flare-diag report</title>"
            "<style>body{font:14px system-ui;margin:2em;max-width:80em}pre{white-space:pre-wrap}</style>"
            f"<pre>{html.escape(md)}</pre>")


async def inject_faults(base: str, token: str, faults: list[dict]) -> None:
    async with httpx.AsyncClient() as c:
        for f in faults:
            r = await c.post(f"{base}/sim/v1/faults", json=f, headers={"Authorization": f"Bearer {token}"})
            if r.status_code != 200:
                raise InputError(f"--fault {f['kind']}: {r.json().get('error', {}).get('message')}")


def rehearse(plan_raw: bytes, plan: Plan, scenario: str, faults: list[dict], out: Path, time_scale: float,
             console: Console) -> dict:
    fixtures = load_fixtures(plan, [])
    import secrets
    token = secrets.token_hex(SIM_TOKEN_BYTES)
    proc, base = start_sim(scenario, time_scale, token)
    try:
        console.print(f"rehearsal against flaresim ({scenario}) at {base}, time x{time_scale:g}; GPU source: simulator")
        asyncio.run(inject_faults(base, token, faults))
        return asyncio.run(run_window(plan_raw, plan, sim_site(base, token), fixtures, out, time_scale, True, console))
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
