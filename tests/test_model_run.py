"""Model runs (the policy against flaresim's host model, no HTTP) and `plan forecast --simulate`."""

from __future__ import annotations

import io
import os
import json
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from flare_diag.daemon.hosts import metrics
from flare_diag.daemon.cli.commands import main
from flare_diag.daemon.rehearsal.modelrun import ModelRun, scraped
from flare_diag.daemon.cli.foreground import rehearse
from flare_diag.daemon.window.setup import load_fixtures
from flare_diag.fixtures.flaresim.host import Host
from flare_diag.fixtures.flaresim.metrics import render
from flare_diag.fixtures.flaresim.scenario import load_scenario
from flare_diag.policies.plan import decode_plan
from tests.simtools import client, parsed

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"


@pytest.mark.parametrize("seed", [0, 3])
def test_a_model_run_ends_every_phase_at_the_minute_a_rehearsal_of_the_same_seed_does(tmp_path, small_plan, seed):
    raw = small_plan.read_bytes()
    plan = decode_plan(raw)
    report = rehearse(raw, plan, "flare-47581cca", [], tmp_path / "out", None, Console(file=io.StringIO()), seed=seed)
    model = ModelRun(raw, plan, load_scenario("flare-47581cca"), load_fixtures(plan, []), seed).run()
    assert model.outcome == report["outcome"] == "completed"
    rehearsed = {c["phase"]: (c["status"], c["ended_minute"]) for c in report["cells"]}
    modelled = {k: (c["status"], c["ended_minute"]) for k, c in model.cells.items()}
    assert modelled.keys() == rehearsed.keys()
    for phase, (status, ended) in rehearsed.items():
        assert modelled[phase][0] == status, phase
        assert (ended is None) == (modelled[phase][1] is None), phase
        if ended is not None:
            assert abs(modelled[phase][1] - ended) <= 0.01, (phase, modelled[phase][1], ended)
    assert model.restoration["within_reservation"] == report["restoration"]["within_reservation"] is True


async def test_the_model_reads_the_hosts_counters_as_a_scrape_of_its_exposition_does():
    host, c = client()
    bodies = parsed()
    auth = {"Authorization": f"Bearer {host.token}"}
    async with c:
        await c.post("/manager/v1/unload", json={"recipe": "glm-incumbent", "sha256": host.sha("glm-incumbent")}, headers=auth)
        await c.post("/manager/v1/load", json={"recipe": "glm-candidate", "sha256": host.sha("glm-candidate")}, headers=auth)
        for b in bodies[:6]:
            r = await c.post("/v1/chat/completions", json={**b, "stream": False}, headers=auth)
            assert r.status_code == 200
    assert scraped(host) == metrics.parse(render(host))
    assert scraped(host)["counters"]["host_lookups"] == 6


def test_a_scrape_of_a_host_with_nothing_loaded_reads_as_an_empty_exposition():
    host = Host(load_scenario("flare-47581cca"))
    host.unload()
    assert scraped(host) == metrics.parse(render(host))


def test_plan_forecast_simulate_prints_the_three_figures(small_plan, capsys):
    rc = main(["plan", "forecast", str(small_plan), "--simulate", "6"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "simulated 6 windows" in out
    assert "every required cell measured: 100.0% of runs" in out
    assert "restore finished inside the reservation: 100.0% of runs" in out
    assert "A.forward_prime *" in out and "p50" in out


def test_plan_forecast_simulate_gives_the_same_figures_for_the_same_seeds(small_plan, capsys):
    assert main(["plan", "forecast", str(small_plan), "--simulate", "4", "--seed", "11", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(["plan", "forecast", str(small_plan), "--simulate", "4", "--seed", "11", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == first
    ends = {p["phase"]: p for p in first["phases"]}
    assert first["runs"] == 4 and first["seeds"] == [11, 14]
    assert ends["A.forward_prime"]["ended"] == 4 and ends["A.forward_prime"]["p10"] <= ends["A.forward_prime"]["p90"]


def test_plan_forecast_simulate_exits_1_when_the_required_cells_do_not_fit(tmp_path, capsys):
    tight = tmp_path / "tight.toml"
    tight.write_text(PLAN.read_text().replace("stop_min = 70 ", "stop_min = 40 "))
    assert main(["plan", "forecast", str(tight), "--simulate", "2"]) == 1
    out = capsys.readouterr().out
    assert "every required cell measured: 0.0% of runs" in out


@pytest.mark.parametrize("flags,what", [(["--simulate", "0"], "--simulate 0"), (["--simulate", "3", "--seed", "-1"], "--seed -1"),
                                         (["--simulate", "3", "--scenario", "nope"], "no such scenario")])
def test_plan_forecast_simulate_refuses_bad_flags_with_exit_2(small_plan, capsys, flags, what):
    assert main(["plan", "forecast", str(small_plan), *flags]) == 2
    err = capsys.readouterr().err
    assert what in err and err.count("\n") == 1


def test_an_in_process_host_refuses_a_request_once_its_block_has_ended():
    from flare_diag.daemon.rehearsal.inprocess import InProcessTransport

    async def app(scope, receive, send):  # pragma: no cover - never reached
        raise AssertionError

    t = InProcessTransport(app, None)  # type: ignore[arg-type]
    with pytest.raises(httpx.ConnectError):
        import anyio
        anyio.run(t.handle_async_request, httpx.Request("GET", "http://x/"))


def _children(pid: int) -> list[int]:
    kids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(p))
            except (OSError, IndexError, ValueError):
                pass
    return kids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_killed_plan_forecast_simulate_leaves_no_worker_running(small_plan):
    import subprocess
    import sys
    import time
    p = subprocess.Popen([sys.executable, "-m", "flare_diag.daemon.cli", "plan", "forecast", str(small_plan),
                          "--simulate", "5000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 120
        while len(workers := _children(p.pid)) < 2:
            assert time.monotonic() < end and p.poll() is None, "no workers started"
            time.sleep(0.05)
        time.sleep(0.5)  # each worker past its start, into its runs
        p.kill()
        p.wait()
        end = time.monotonic() + 30
        while [w for w in workers if _alive(w)]:
            assert time.monotonic() < end, f"workers still running after their command was killed: {workers}"
            time.sleep(0.05)
    finally:
        if p.poll() is None:
            p.kill()
