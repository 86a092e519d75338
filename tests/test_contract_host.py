"""The window against a second Flare host written from contract.md alone (tests/contract_host.py).

Nothing here is flaresim: five services on five ports, replies with exactly the contract's fields, a
plain LRU of full-prompt checkpoints. Where this host and flaresim disagree, the contract decides.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flare_diag.events.reader import LogReader
from flare_diag.daemon.forecast import PROBE_REQUESTS
from tests.contract_tools import PLAN, ROOT, ContractHost

SCALE = "60"
MUTATING = ("/manager/v1/load", "/manager/v1/unload", "/quiesce", "/readmit", "/flare/v1/trace", "/v1/chat/completions")


def flare_diag(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def run_window(host: ContractHost, out: Path, plan: Path = PLAN) -> tuple[int, dict]:
    p = flare_diag("run", "--plan", str(plan), "--site", str(host.site), "--out", str(out), "--time-scale", SCALE)
    assert (out / "report.json").exists(), p.stdout[-3000:] + p.stderr[-3000:]
    return p.returncode, json.loads((out / "report.json").read_text())


def _without_trace(plan: Path, folder: Path) -> Path:
    """The plan's replay arms on the eight-body working set, without the trace arms (not what these test)."""
    text = plan.read_text()
    out = folder / "no-trace.toml"
    out.write_text(text[:text.index("[trace]")] + text[text.index("[[conditional]]"):])
    return out


def required_cells(r: dict) -> dict:
    want = ("A.identity", "A.forward_prime", "A.reverse_replay", "B.identity", "B.forward_prime", "B.forward_replay")
    return {c["phase"]: c["status"] for c in r["cells"] if c["phase"] in want}


@pytest.fixture
def churning_host(tmp_path):
    h = ContractHost(tmp_path / "host", cache_entries=40)  # fewer entries than the 52 bodies
    yield h
    h.stop()


@pytest.fixture(scope="module")
def churn_window(tmp_path_factory, small_plan):
    """One whole window of the 2026-10-22 plan's shape (the eight-body working set) on a contract host
    whose cache holds fewer entries than that, read by the tests below."""
    tmp = tmp_path_factory.mktemp("churn")
    h = ContractHost(tmp / "host", cache_entries=4)
    try:
        rc, r = run_window(h, tmp / "out", _without_trace(small_plan, tmp))
    finally:
        h.stop()
    return rc, r, tmp / "out"


def test_a_churning_contract_host_gives_row_checkpoint_churn(churn_window):
    rc, r, _out = churn_window
    assert rc == 0 and r["outcome"] == "completed", (r["abort"], r["restoration"], r["alarms"])
    assert set(required_cells(r).values()) == {"measured"}
    assert r["verdict"]["hypothesis"] == "row_checkpoint_churn"
    assert r["restoration"]["verified"] and r["restoration"]["incumbent_sha256_match"]
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]


def test_a_contract_host_whose_cache_holds_the_working_set_gives_not_reproduced(tmp_path, small_plan):
    host = ContractHost(tmp_path / "host", cache_entries=500)
    try:
        rc, r = run_window(host, tmp_path / "out", _without_trace(small_plan, tmp_path))  # quicker
    finally:
        host.stop()
    assert rc == 0 and r["outcome"] == "completed", (r["abort"], r["restoration"], r["alarms"])
    assert set(required_cells(r).values()) == {"measured"}
    assert r["verdict"]["hypothesis"] == "not_reproduced"


def test_recipe_bytes_are_retained_by_hash_and_every_load_names_that_hash(churn_window):
    import hashlib
    _rc, r, out = churn_window
    rec = r["recipes"]
    for role in ("incumbent", "candidate"):
        kept = Path(rec[role]["path"])
        assert kept.parent == out / "recipes"
        assert hashlib.sha256(kept.read_bytes()).hexdigest() == rec[role]["sha256"] == kept.name
    assert rec["rollback"]["sha256"] == rec["incumbent"]["sha256"] and rec["rollback"]["preview"]
    with LogReader(out / "log.db") as reader:
        loads = [ev.args for e in reader.iter() if type(ev := e.event()).__name__ == "ActionRequested"
                 and ev.action in ("load", "unload", "preview")]
    assert loads and all(a["sha256"] in (rec["incumbent"]["sha256"], rec["candidate"]["sha256"]) for a in loads)


def test_idle_keepalive_closes_between_phases_abort_nothing_and_send_no_request_twice(tmp_path, small_plan):
    # The host drops any request that arrives on a connection idle for over 1 s (its close crossing
    # the request); every load and unload keeps the window waiting 1.5 s, longer than that.
    host = ContractHost(tmp_path / "host", cache_entries=40, idle_close_s=1.0, load_delay_s=1.5)
    plan = _without_trace(small_plan, tmp_path)
    try:
        rc, r = run_window(host, tmp_path / "out", plan)
        seen = host.requests()
    finally:
        host.stop()
    assert r["abort"] is None and rc == 0 and r["outcome"] == "completed", (r["abort"], r["restoration"], r["alarms"])
    dropped = [x for x in seen if x.get("dropped")]
    assert dropped, "the host never closed an idle connection under a request: this test tested nothing"
    assert not [x for x in dropped if any(m in x["request"] for m in MUTATING)]
    chats = [x for x in seen if x.get("path") == "/v1/chat/completions" and x["service"] == "serving"]
    with LogReader(tmp_path / "out" / "log.db") as reader:
        events = [e.event() for e in reader.iter()]
    sent = [e for e in events if type(e).__name__ == "ActionRequested" and e.action == "send_request"]
    direct = [e for e in events if type(e).__name__ == "ActionRequested" and e.action == "preflight"
              and e.args.get("path") == "direct"]
    # a site whose GPUs are simulated is a rehearsal: its forecast probed a few bodies before the
    # window opened, and the window's opening records how many
    opened = next(e for e in events if type(e).__name__ == "WindowOpened")
    probe = opened.calibration.get("rounds", 0) + 1  # the probe's first request warms up and is not counted
    assert probe == PROBE_REQUESTS and "probe" in opened.calibration["source"]
    assert len(chats) == len(sent) + len(direct) + probe


def test_site_check_passes_on_the_contract_host(churning_host):
    p = flare_diag("site", "check", str(churning_host.site), "--plan", str(PLAN))
    assert p.returncode == 0, p.stdout
    assert p.stdout.splitlines()[-1].startswith("site check: ready")
    assert not [x for x in churning_host.requests() if any(m in x.get("path", "") for m in MUTATING)]


def test_site_check_passes_on_flaresim(tmp_path):
    from tests.daemontools import Sim
    sim = Sim(tmp_path)
    try:
        p = flare_diag("site", "check", str(sim.site), "--plan", str(PLAN), "--json")
    finally:
        sim.stop()
    assert p.returncode == 0, p.stdout
    check = json.loads(p.stdout)
    assert check["ready"] and not check["missing"]


def test_site_check_reports_a_host_without_drain_gauges_and_exits_1(tmp_path):
    host = ContractHost(tmp_path / "host", omit_metrics=["flare_requests_active", "flare_requests_pending"])
    try:
        p = flare_diag("site", "check", str(host.site), "--plan", str(PLAN), "--json")
    finally:
        host.stop()
    assert p.returncode == 1
    check = json.loads(p.stdout)
    assert set(check["missing"]) == {"drain.requests_active", "drain.requests_pending"}
    by_name = {c["name"]: c for c in check["capabilities"]}
    assert by_name["drain.requests_active"]["status"] == "not observable"


def test_site_check_with_wrong_tokens_says_so_in_one_line_per_service(tmp_path, churning_host):
    bad = churning_host.write_site(tmp_path / "bad", tokens={s: "not-the-token" for s in churning_host.tokens})
    p = flare_diag("site", "check", str(bad))
    assert p.returncode == 1
    down = [line for line in p.stdout.splitlines() if line.startswith("SERVICE DOWN")]
    assert len(down) == 5
    for svc in ("serving", "manager", "router", "monitoring", "gpu"):
        assert sum(f" {svc}: the service refused the token from {bad.parent / (svc + '.token')}" in line
                   for line in down) == 1
    assert "not-the-token" not in p.stdout + p.stderr


def test_run_on_a_site_that_lacks_a_required_capability_exits_2_and_changes_nothing(tmp_path):
    host = ContractHost(tmp_path / "host", omit_metrics=["flare_requests_active", "flare_requests_pending"])
    try:
        p = flare_diag("run", "--plan", str(PLAN), "--site", str(host.site), "--out", str(tmp_path / "out"))
        seen = host.requests()
    finally:
        host.stop()
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "drain.requests_active" in p.stderr
    assert not [x for x in seen if any(m in x.get("path", "") for m in MUTATING)]
    assert not (tmp_path / "out" / "log.db").exists()
