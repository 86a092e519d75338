"""Steady-state guards against a real Prometheus (Debian's `prometheus`, started here, scraping flaresim's
router and the contract host every second): a guard on the routed error rate aborts `steady_state`
and restores, a dry-run guard only logs, a pool already unhealthy is refused before anything changes,
a pool that saturates when the primary leaves is caught, and `site check` names every guard's series.

The windows run on the wall clock at x4 (`run --time-scale 4` against `flare-diag sim serve`): Prometheus
scrapes in real seconds, so these windows cannot run in virtual time. Every deadline here is in real
seconds and generous; the guards' own bounds (interval, consecutive breaches) are what is tested.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from flare_diag.daemon.reproducer.followon import _without_none
from flare_diag.policies.plan import decode_plan
from tests.contract_tools import ContractHost
from tests.daemontools import PLAN, ROOT, Sim
from tests.promtools import BINARY, PromServer
from tests.reviewtools import with_review

SCALE = 4
SCENARIO = ROOT / "fixtures" / "flaresim" / "scenarios" / "flare-47581cca.toml"
# the routed path's share of failed answers over the last five (real) seconds
ERROR_RATIO = ('sum(rate(flare_router_requests_total{code=~"5.."}[5s])) / sum(rate(flare_router_requests_total[5s]))')

# .ci/run installs Prometheus; under CI a missing one fails these tests rather than skipping them
pytestmark = pytest.mark.skipif(not Path(BINARY).exists() and not os.environ.get("CI"),
                                reason="Debian's prometheus is not installed (.ci/run installs it)")


def _scenario(tmp: Path, name: str, **pool) -> Path:
    """The default scenario with slow decoding (a phase that lasts long enough on the wall clock for a
    guard to be scraped, evaluated and breached inside it) and the pool given."""
    text = SCENARIO.read_text().replace('name = "flare-47581cca"', f'name = "{name}"')
    text += "\ndecode_tokens_per_s = 40.0\nload_s = 10.0\n" + "".join(f"{k} = {v}\n" for k, v in pool.items())
    p = tmp / f"{name}.toml"
    p.write_text(text)
    return p


def _plan(tmp: Path, guards: list[dict], name: str = "steady") -> Path:
    plan = msgspec.to_builtins(decode_plan(PLAN.read_bytes()))
    plan.update(name=name, guards=guards, conditional=[])
    for k in ("starting_observation", "trace"):
        plan.pop(k, None)
    plan["phases"] = [{"id": "A.identity", "incarnation": "A", "kind": "identity", "fresh": True},
                      {"id": "A.forward_prime", "incarnation": "A", "kind": "replay", "fixture": "tok1024",
                       "select_last": 4}]
    p = tmp / f"{name}.toml"
    p.write_bytes(msgspec.toml.encode(_without_none(plan)))
    return p


def _guard(**kw) -> dict:
    return {"name": "routed-errors", "query": ERROR_RATIO, "breach_if": ">", "threshold": 0.05, "consecutive": 2,
            "interval_s": 4.0, **kw}


class Pool:
    """flaresim as a process at x4, with Prometheus scraping its router (and the contract host)."""

    def __init__(self, tmp: Path, scenario: Path, contract: ContractHost | None = None) -> None:
        self.sim = Sim(tmp, scenario=str(scenario), time_scale=SCALE)
        targets = [{"job": "flaresim-router", "url": self.sim.url, "path": "/routed/router/v1/metrics",
                    "token_file": tmp / "sim.token"}]
        if contract is not None:
            targets.append({"job": "contract-host", "url": contract.urls["serving"], "path": "/metrics",
                            "token_file": contract.site.parent / "serving.token"})
        try:
            self.prom = PromServer(targets)
            self.prom.wait_up([t["job"] for t in targets])
            # two scrapes at least, so that a rate over five seconds has a number
            self.prom.wait(lambda: self.prom.value(ERROR_RATIO) is not None, 30, "the routed error ratio")
        except BaseException:
            self.sim.stop()
            raise
        with self.sim.site.open("a") as f:
            f.write(f'[steady_state]\nprometheus_url = "{self.prom.url}"\n')

    def fault(self, kind: str, **params) -> None:
        httpx.post(f"{self.sim.url}/sim/v1/faults", json={"kind": kind, "at": "now", **params},
                   headers={"Authorization": f"Bearer {self.sim.token}"}, timeout=10).raise_for_status()

    def stop(self) -> None:
        self.prom.stop()
        self.sim.stop()


def _run(plan: Path, site: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flare_diag.daemon.cli", *with_review(["run", "--plan", str(plan), "--site",
                             str(site), "--out", str(out), "--time-scale", str(SCALE)])], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _when_quiesced(pool: Pool, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError("the window ended before the quiesce: " + proc.stderr.read()[-2000:])
        if not pool.sim.get("/routed/router/v1/backends")["backends"][0]["admitted"]:
            return
        time.sleep(0.1)
    raise AssertionError("the primary was not quiesced in time")


def _finish(proc: subprocess.Popen, out: Path, timeout: float = 240) -> tuple[int, dict]:
    try:
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (out / "report.json").exists(), proc.stdout.read()[-2000:] + proc.stderr.read()[-3000:]
    return proc.returncode, json.loads((out / "report.json").read_text())


@pytest.fixture
def pool(tmp_path):
    p = Pool(tmp_path, _scenario(tmp_path, "steady"))
    yield p
    p.stop()


def test_a_guard_on_the_routed_error_rate_aborts_steady_state_mid_window_and_restores(tmp_path, pool):
    plan = _plan(tmp_path, [_guard()])
    proc = _run(plan, pool.sim.site, tmp_path / "out")
    _when_quiesced(pool, proc)
    pool.fault("routed_errors", ratio=0.5, duration_s=60)  # host seconds: 15 real at x4
    rc, r = _finish(proc, tmp_path / "out")
    assert (rc, r["outcome"], r["abort"]["reason"]) == (1, "aborted", "steady_state"), r["abort"]
    assert "guard routed-errors" in r["abort"]["detail"] and "for 2 consecutive evaluations" in r["abort"]["detail"]
    assert r["restoration"]["verified"] and r["restoration"]["readmitted"]
    g = r["steady_state"]["guards"][0]
    assert [p for p in g["series"] if p["when"] == "before"][0]["breach"] is False
    assert any(p["breach"] for p in g["series"] if p["when"] == "during")
    # once the fault is over and the primary back, the pool holds again: no alarm for a person
    assert [p for p in g["series"] if p["when"] == "after"][-1]["breach"] is False
    assert not [a for a in r["alarms"] if a["kind"] == "steady_state_after"]
    html = (tmp_path / "out" / "report.html").read_text()
    assert 'id="chart-guard-routed-errors"' in html or "id=chart-guard-routed-errors" in html
    assert 'class="breach"' in html


def test_a_dry_run_guard_only_logs_its_breach_and_the_window_completes(tmp_path, pool):
    plan = _plan(tmp_path, [_guard(dry_run=True)])
    proc = _run(plan, pool.sim.site, tmp_path / "out")
    _when_quiesced(pool, proc)
    pool.fault("routed_errors", ratio=0.5, duration_s=60)
    rc, r = _finish(proc, tmp_path / "out")
    assert (rc, r["outcome"], r["abort"]) == (0, "completed", None)
    said = [a for a in r["alarms"] if a["kind"] == "guard_dry_run"]
    assert len(said) == 1 and "would have aborted" in said[0]["detail"]
    assert any(p["breach"] for p in r["steady_state"]["guards"][0]["series"] if p["when"] == "during")


def test_a_pool_already_unhealthy_is_refused_before_anything_changes(tmp_path, pool):
    pool.fault("routed_errors", ratio=0.5)
    pool.prom.wait(lambda: (pool.prom.value(ERROR_RATIO) or 0) > 0.05, 30, "the breach in Prometheus")
    before = pool.sim.get("/manager/v1/state")["loaded"]
    proc = _run(_plan(tmp_path, [_guard()]), pool.sim.site, tmp_path / "out")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, out[-1000:] + err[-2000:]
    assert "guard.routed-errors" in err and "already unhealthy" in err and len(err.strip().splitlines()) == 1
    assert pool.sim.get("/manager/v1/state")["loaded"] == before
    assert pool.sim.get("/routed/router/v1/backends")["backends"][0]["admitted"] is True
    assert not (tmp_path / "out" / "log.db").exists()


def test_a_pool_that_saturates_when_the_primary_leaves_aborts_steady_state_and_restores(tmp_path):
    # three backends at 25 requests a second, 10 each: 83 % busy with the primary, 125 % without it
    pool = Pool(tmp_path, _scenario(tmp_path, "saturates", pool_backends=3, pool_offered_rps=25.0))
    try:
        plan = _plan(tmp_path, [_guard()])
        rc, r = _finish(_run(plan, pool.sim.site, tmp_path / "out"), tmp_path / "out")
    finally:
        pool.stop()
    assert (rc, r["outcome"], r["abort"]["reason"]) == (1, "aborted", "steady_state"), r["abort"]
    assert r["restoration"]["verified"]
    g = r["steady_state"]["guards"][0]
    breaches = [p for p in g["series"] if p["breach"]]
    assert breaches and all(p["minute"] is not None and p["minute"] >= 0 for p in breaches)  # only once it left
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Steady state" in md and "routed-errors" in md
    html = (tmp_path / "out" / "report.html").read_text()
    assert "chart-guard-routed-errors" in html and 'class="breach"' in html  # the chart shows the breach


def test_site_check_names_every_guards_series_as_observable_or_not(tmp_path):
    contract = ContractHost(tmp_path / "contract")
    pool = Pool(tmp_path, _scenario(tmp_path, "steady"), contract)
    try:
        plan = _plan(tmp_path, [_guard(), _guard(name="contract-active", query="max(flare_requests_active)",
                                                breach_if=">", threshold=64),
                                _guard(name="vllm-waiting", query="max(vllm:num_requests_waiting)", breach_if=">",
                                       threshold=10, dry_run=True)])
        p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "site", "check", str(pool.sim.site),
                            "--plan", str(plan), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        pool.stop()
        contract.stop()
    caps = {c["name"]: c for c in json.loads(p.stdout)["capabilities"]}
    assert caps['guard.routed-errors.series flare_router_requests_total{code=~"5.."}']["status"] == "observable"
    assert caps["guard.contract-active.series flare_requests_active"]["status"] == "observable"
    unknown = caps["guard.vllm-waiting.series vllm:num_requests_waiting"]
    assert unknown["status"] == "not observable" and "knows no such series" in unknown["reason"] and not unknown["missing"]
    assert caps["guard.routed-errors"]["status"] == "observable" and caps["guard.routed-errors"]["fits"]


def test_a_guard_of_the_restore_raises_its_alarm_through_the_runner_and_the_primary_is_still_readmitted(tmp_path):
    # the pool saturates while the primary is out; this guard watches only the restore, which goes on
    pool = Pool(tmp_path, _scenario(tmp_path, "saturates", pool_backends=3, pool_offered_rps=25.0))
    try:
        plan = _plan(tmp_path, [_guard(during="restore")])
        rc, r = _finish(_run(plan, pool.sim.site, tmp_path / "out"), tmp_path / "out")
    finally:
        pool.stop()
    assert (rc, r["outcome"], r["abort"]) == (0, "completed", None)  # it does not guard the experiment
    during = [a for a in r["alarms"] if a["kind"] == "steady_state_during_restore"]
    assert len(during) == 1 and "guard routed-errors" in during[0]["detail"]
    assert r["restoration"]["verified"] and r["restoration"]["readmitted"]
    g = r["steady_state"]["guards"][0]
    assert [p for p in g["series"] if p["when"] == "after"][-1]["breach"] is False  # the readmit relieved it
