"""The restore's own integrity, through the real runner against flaresim (issue 18, items 5-7, 9, 10)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import httpx

from flare_diag.events.reader import LogReader
from tests.daemontools import Sim
from tests.test_fault_matrix import ROOT, aborted_and_restored, rehearse, rehearse_printing
from tests.reviewtools import with_review
from tests.simtools import flare_diag_here


def _events(log) -> list:
    with LogReader(log) as reader:
        return [e.event() for e in reader.iter()]


def test_an_xid_during_the_restore_blocks_readmission_and_exits_3(small_plan, tmp_path):
    # the operator-like abort at request 4 sends the window to restore; the restore's incumbent load
    # is the second manager load of the window (after incarnation A's), and the Xid lands as it completes
    out = tmp_path / "out"
    rc, r = rehearse(small_plan, out, "--fault", "auth@request=4", "--fault", "xid@after_load=2")
    assert rc == 3 and r["outcome"] == "restore_failed", r["restoration"]
    res = r["restoration"]
    assert res["no_fault_during_restore"] is False and res["readmitted"] is False and not res["verified"]
    kinds = [a["kind"] for a in r["alarms"]]
    assert "fault_during_restore" in kinds and "primary_left_quiesced" in kinds
    evs = _events(out / "log.db")
    assert not [e for e in evs if type(e).__name__ == "ActionRequested" and e.action == "readmit"]
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]


def test_a_failure_before_anything_changed_is_preflight_with_no_quiesce_alarm(small_plan, tmp_path):
    # the engine is gone before the window's own preflight: nothing is quiesced, unloaded or loaded
    out = tmp_path / "out"
    rc, r = rehearse(small_plan, out, "--fault", "engine_crash")
    assert r["abort"]["reason"] == "preflight", r["abort"]
    assert "primary_left_quiesced" not in [a["kind"] for a in r["alarms"]]
    evs = _events(out / "log.db")
    changed = [e.action for e in evs if type(e).__name__ == "ActionRequested"
               and e.action in ("quiesce", "unload", "load", "readmit", "set_trace")]
    assert changed == []
    assert r["restoration"]["readmitted"] is None
    # the engine the window found dead is still dead: the restoration cannot verify it, and says so
    assert rc == 3 and r["outcome"] == "restore_failed" and r["restoration"]["direct_preflight"] is False


def test_a_preflight_abort_claims_no_restoration_and_names_no_minute(small_plan, tmp_path):
    out = tmp_path / "out"
    rc, r, said = rehearse_printing(small_plan, out, "--fault", "identity_drift")
    assert (rc, r["abort"]["reason"], r["restoration"]["host_changed"]) == (1, "preflight", False), r["abort"]
    head = (out / "report.md").read_text().split("## ")[0]
    assert "Restoration: none needed" in head and "Restoration: verified" not in head
    assert "aborted before its t0" in head and "minute n/a" not in head
    assert "restoration verified" not in said and "no restoration needed" in said
    assert "window closed: aborted before its t0" in said and "minute None" not in said


def test_an_engine_that_crashes_between_requests_aborts_engine_lost_and_is_restored(small_plan, tmp_path):
    out = tmp_path / "out"
    rc, r = rehearse(small_plan, out, "--fault", "engine_crash@after_request=3")
    seqs = aborted_and_restored(rc, r, out / "log.db")
    assert r["abort"]["reason"] == "engine_lost" and "/health answered 503" in r["abort"]["detail"]
    failed = [ev for _s, ev in seqs if type(ev).__name__ == "RequestDone" and ev.outcome != "ok" and ev.phase != "preflight"]
    # concurrency 1: the identity read after each request sees the engine gone before the next one is
    # sent; at most the one request that met the dead engine failed
    assert len(failed) <= 1


def test_an_engine_that_crashes_as_the_candidate_loads_aborts_engine_lost_at_its_identity_phase(small_plan, tmp_path):
    # it was `identity_drift` naming two fields "found None": the engine was gone, not changed
    out = tmp_path / "out"
    rc, r = rehearse(small_plan, out, "--fault", "engine_crash@after_load=1")
    aborted_and_restored(rc, r, out / "log.db")
    assert r["abort"]["reason"] == "engine_lost", r["abort"]
    assert r["abort"]["detail"].startswith("A.identity: the identity at the phase's start shows no incarnation loaded")
    ident = next(c for c in r["cells"] if c["phase"] == "A.identity")
    assert (ident["status"], ident["reason"]) == ("failed", "window aborted (engine_lost), during this phase")


def test_a_window_refuses_a_host_whose_loaded_recipe_is_the_candidate(small_plan, tmp_path):
    sim = Sim(tmp_path)
    try:
        h = {"Authorization": f"Bearer {sim.token}"}
        state = sim.get("/manager/v1/state")["loaded"]
        cand = sim.get("/manager/v1/recipes/glm-candidate")
        httpx.post(f"{sim.url}/manager/v1/unload", json={"recipe": state["recipe"], "sha256": state["sha256"]}, headers=h)
        httpx.post(f"{sim.url}/manager/v1/load", json={"recipe": "glm-candidate", "sha256": cand["sha256"]}, headers=h, timeout=30)
        assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-candidate"
        out = tmp_path / "out"
        p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", *with_review(["run", "--plan", str(small_plan), "--site",
                            str(sim.site), "--out", str(out), "--time-scale", "100"])], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env={**os.environ, "COLUMNS": "200"})
        r = json.loads((out / "report.json").read_text())
        assert r["abort"]["reason"] == "preflight" and "is the plan's candidate" in r["abort"]["detail"], p.stdout[-2000:]
        assert p.returncode == 1 and r["restoration"]["verified"]
        evs = _events(out / "log.db")
        assert not [e for e in evs if type(e).__name__ == "ActionRequested" and e.action in ("quiesce", "unload", "load")]
        assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-candidate"  # left as found, for a person
    finally:
        sim.stop()


def test_a_restore_too_slow_for_its_budget_ends_inside_it_and_exits_3(small_plan, tmp_path):
    # every answer 50 times slower: the restore's load and checks cannot finish in a 5-minute budget;
    # they are cut at its end, and the outcome says the restoration did not verify
    plan = tmp_path / "budget.toml"
    plan.write_text(small_plan.read_text().replace("[timing]", "[timing]\nrestore_budget_min = 5"))
    out = tmp_path / "out"
    rc, r = rehearse(plan, out, "--fault", "slow@request=1,factor=50", "--accept-partial")
    res = r["restoration"]
    assert rc == 3 and r["outcome"] == "restore_failed" and not res["verified"], res
    # each action cut at the budget's end still costs the harness's real latency, times the scale (x100)
    assert res["finished_minute"] - res["started_minute"] <= 5.0 + 0.5
    assert res["within_reservation"] is True and res["readmitted"] is False
    assert "primary_left_quiesced" in [a["kind"] for a in r["alarms"]]


def test_a_counter_reset_that_did_not_happen_on_the_real_load_path_is_caught(small_plan, tmp_path):
    # the fault lands as incarnation A's load completes; B's load, after A's unload, keeps A's counters
    out = tmp_path / "out"
    rc, r = rehearse(small_plan, out, "--fault", "counter_reset_failure@after_load=1", "--accept-partial")
    b_identity = next(c for c in r["cells"] if c["phase"] == "B.identity")
    assert b_identity["status"] == "invalid" and "counters not reset" in b_identity["reason"], b_identity
    assert r["outcome"] == "partial" and r["restoration"]["verified"] and rc == 1


def test_a_router_that_hangs_is_the_router_watch_lost_and_the_primary_stays_out(small_plan, tmp_path):
    # each watch polls on its own with a deadline: the hung router silences only the router watch,
    # and the restore, unable to check containment or readmit, leaves the primary quiesced (exit 3)
    out = tmp_path / "out"
    rc, r = rehearse(small_plan, out, "--fault", "router_hang@request=4")
    assert r["abort"]["reason"] == "watch_lost" and "router watch" in r["abort"]["detail"], r["abort"]
    assert rc == 3 and r["outcome"] == "restore_failed" and r["restoration"]["readmitted"] is False
    evs = _events(out / "log.db")
    last_router = max(e.at_ns for e in evs if type(e).__name__ == "WatchObserved" and e.source == "router")
    gpu_after = [e for e in evs if type(e).__name__ == "WatchObserved" and e.source == "gpu" and e.at_ns > last_router]
    assert len(gpu_after) >= 2  # the GPU watch went on answering beside the hung router
    abort_at = next(i for i, e in enumerate(evs) if type(e).__name__ == "AbortDecided")
    assert not [e for e in evs[abort_at:] if type(e).__name__ == "ActionRequested" and e.experimental]


def test_a_watch_read_the_host_holds_past_its_deadline_is_logged_a_timeout_not_this_daemons_error(small_plan, tmp_path):
    # the hung router's reads ended at the watch's own deadline, and were logged as the daemon's internal
    # error ("not the host's fault"), with a traceback on stderr, when the host was the one that held them
    out = tmp_path / "out"
    rc, _stdout, stderr = flare_diag_here("rehearse", "--plan", str(small_plan), "--out", str(out),
                                          "--fault", "router_hang@before_load=1")
    failed = [e for e in _events(out / "log.db") if type(e).__name__ == "WatchFailed" and e.source == "router"]
    assert failed and {e.error for e in failed} == {"timeout"}, {(e.error, e.detail) for e in failed}
    assert "no answer within" in failed[0].detail and "internal" not in failed[0].detail, failed[0].detail
    assert "Traceback" not in stderr, stderr[-2000:]


def test_a_readmit_the_router_acknowledges_but_does_not_apply_is_not_called_verified(small_plan, tmp_path):
    # the readmit's reply says admitted; the router's own view after it says otherwise: the window changed
    # the backend's admission, so only the router's view can say it is back
    out = tmp_path / "out"
    rc, r = rehearse(small_plan, out, "--fault", "readmit_ignored")
    assert rc == 3 and r["outcome"] == "restore_failed" and r["restoration"]["readmitted"] is False, r["restoration"]
    alarm = next(a for a in r["alarms"] if a["kind"] == "readmit_not_verified")
    assert "shows backend primary admitted False" in alarm["detail"], alarm
    assert r["snapshots"]["readmitted"]["router"]["data"]["backend"]["admitted"] is False


def test_a_verified_readmission_shows_the_routers_own_view_after_the_readmit(default_rehearsal):
    _rc, r, out = default_rehearsal
    after = r["snapshots"]["readmitted"]["router"]
    assert after["data"]["backend"]["admitted"] is True and r["restoration"]["readmitted"] is True
    assert after["minute"] >= r["snapshots"]["after"]["router"]["minute"]
    assert "| router | after readmission |" in (out / "report.md").read_text()


# --- the last gate before readmission (issue 26) ----------------------------------------------

# fault fired as the restore's load of the incumbent completes (the candidate's load is the first)
RESTORE_TIME_FAULTS = {
    "containment": "containment", "gpu_memory": "uncontrolled_growth", "growth": "uncontrolled_growth",
    "resident_creep,step_gib=40": "resident memory grew", "queue_growth": "did not drain", "xid": "Xid",
    # an identity or GPU that differs is already caught by the restore's own identity and containment checks
    "identity_drift,field=tensor_parallel": "incumbent_sha256_match", "identity_drift,field=gpu_power_limit_w": "containment",
}


@pytest.mark.parametrize("fault", list(RESTORE_TIME_FAULTS))
def test_a_rule_breached_during_the_restore_keeps_the_primary_out_and_exits_3(small_plan, tmp_path, fault):
    kind, _, params = fault.partition(",")
    spec = f"{kind}@after_load=2" + (f",{params}" if params else "")
    out = tmp_path / "out"
    rc, r = rehearse(small_plan, out, "--fault", "auth@request=3", "--fault", spec)
    assert (rc, r["outcome"]) == (3, "restore_failed"), (r["restoration"], r["alarms"])
    rest = r["restoration"]
    assert rest["readmitted"] is False and not rest["verified"]
    kinds = {a["kind"]: a["detail"] for a in r["alarms"]}
    # a router that admitted the backend itself (the containment fault) is said to have: the primary is not out
    left = "primary_admitted_unverified" if kind == "containment" else "primary_left_quiesced"
    assert left in kinds and RESTORE_TIME_FAULTS[fault] in kinds[left] and len(kinds.keys() & {
        "primary_admitted_unverified", "primary_left_quiesced"}) == 1, kinds
    with LogReader(out / "log.db") as reader:
        actions = [ev.action for e in reader.iter() if e.type == "action_requested" for ev in [e.event()]]
    assert "readmit" not in actions
