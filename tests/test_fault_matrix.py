"""Every abort fault of the contract, injected before, during and between phases, ends in a verified restore."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flare_diag.events.reader import LogReader
from flare_diag.policies.audit import state_at
from tests.simtools import flare_diag_here

ROOT = Path(__file__).resolve().parent.parent
SMALL_PHASE = 8  # the tok1024 working set: the plan's shape with eight bodies per replay phase

# fault kind -> the abort reason the contract's rules give it
ABORT_FAULTS = {
    "xid": "gpu_fault", "oom": "gpu_fault", "auth": "authentication", "malformed_json": "malformed_transport",
    "malformed_sse": "malformed_transport", "identity_drift": "identity_drift", "growth": "uncontrolled_growth",
    "containment": "containment",
}
# before: as the first experimental request arrives; during: mid-phase; between: after the first
# replay phase's last answer, before the next phase's first request
MOMENTS = {"before": "request=1", "during": "request=4", "between": f"after_request={SMALL_PHASE}"}


def rehearse_printing(plan: Path, out: Path, *extra: str) -> tuple[int, dict, str]:
    rc, stdout, stderr = flare_diag_here("rehearse", "--plan", str(plan), "--out", str(out), *extra)
    assert (out / "report.json").exists(), stdout[-2000:] + stderr[-2000:]
    return rc, json.loads((out / "report.json").read_text()), stdout


def aborted_and_restored(rc: int, r: dict, log: Path) -> list:
    """The window aborted (exit 1), restored and verified; its log verifies and audits; no
    experimental request was decided after the abort. Returns the log's (seq, event) pairs."""
    assert (rc, r["outcome"]) == (1, "aborted"), r["cells"]
    assert r["restoration"]["verified"], r["restoration"]
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]
    with LogReader(log) as reader:
        records = [(e.seq, e.window_id, e.event()) for e in reader.iter()]
    seqs = [(s, ev) for s, _w, ev in records]
    # the decider replayed from the inputs alone holds what the report folded from the decisions
    held = state_at(records, r["window_id"]).state
    assert held.stage == "closed" and held.abort is not None and held.abort.reason == r["abort"]["reason"]
    assert {p: c.status for p, c in held.cells.items()} == {c["phase"]: c["status"] for c in r["cells"]}
    assert held.incumbent_back and held.readmit_requested and not held.outstanding
    abort_seq = next(s for s, ev in seqs if type(ev).__name__ == "AbortDecided")
    assert not [ev for s, ev in seqs if s > abort_seq and type(ev).__name__ == "ActionRequested" and ev.experimental]
    return seqs


def rehearse(plan: Path, out: Path, *extra: str) -> tuple[int, dict]:
    rc, report, _stdout = rehearse_printing(plan, out, *extra)
    return rc, report


@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.parametrize("kind", list(ABORT_FAULTS))
def test_abort_fault_ends_aborted_with_a_verified_restore_and_no_later_experiment(small_plan, tmp_path, kind, moment):
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", f"{kind}@{MOMENTS[moment]}")
    seqs = aborted_and_restored(rc, r, tmp_path / "out" / "log.db")
    assert r["abort"]["reason"] == ABORT_FAULTS[kind], r["abort"]
    sent = {}
    for _s, ev in seqs:
        if type(ev).__name__ == "ActionRequested" and ev.action == "send_request":
            sent[ev.args["phase"]] = sent.get(ev.args["phase"], 0) + 1
    if moment == "between":  # the first phase was sent whole; the next one got at most the request that met the fault
        assert sent.get("A.forward_prime") == SMALL_PHASE and sent.get("A.reverse_replay", 0) <= 1
        assert not [q for q in r["requests"] if q["phase"] == "A.reverse_replay" and q["outcome"] == "ok"]
    else:
        assert sent.get("A.forward_prime", 0) < SMALL_PHASE


def test_an_incumbent_that_will_not_load_ends_restore_failed_with_the_primary_left_quiesced(small_plan, tmp_path):
    rc, r, printed = rehearse_printing(small_plan, tmp_path / "out", "--fault", "auth@request=3",
                                       "--fault", "load_failure@request=3")
    assert (rc, r["outcome"], r["abort"]["reason"]) == (3, "restore_failed", "authentication")  # needs a person
    assert "ALARM primary_left_quiesced" in printed and "restoration NOT verified" in printed
    rest = r["restoration"]
    assert not rest["verified"] and rest["incumbent_sha256_match"] is False and rest["readmitted"] is False
    assert [a["kind"] for a in r["alarms"]] == ["primary_left_quiesced"]
    with LogReader(tmp_path / "out" / "log.db") as reader:
        actions = [ev.action for e in reader.iter() if e.type == "action_requested" for ev in [e.event()]]
    assert actions.count("load") >= 2 and "readmit" not in actions  # tried the incumbent again; never readmitted


def test_a_candidate_load_that_never_answers_is_not_sent_again_and_the_window_restores_early(small_plan, tmp_path):
    # the manager's load of A never answers (its engine never becomes healthy) and the manager still shows it
    # running: the window does not load B over it, and ends at the restore rather than another load deadline later
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", "load_hang@before_load=1")
    assert (rc, r["outcome"], r["abort"]) == (1, "partial", None)
    cells = {c["phase"]: c for c in r["cells"]}
    assert cells["A.identity"]["reason"] == "candidate incarnation A did not load: load: no answer within its deadline of 600 s"
    assert cells["B.identity"]["status"] == "failed" and cells["B.identity"]["reason"] == (
        "not started: the candidate's load as incarnation A got no answer within its deadline, and the "
        "manager then showed a load or unload still running: no later arm loads the candidate")
    assert r["restoration"]["verified"] and r["restoration"]["started_minute"] < 12  # one load deadline, not two
    with LogReader(tmp_path / "out" / "log.db") as reader:
        loads = [ev.args["label"] for e in reader.iter() if e.type == "action_requested" for ev in [e.event()]
                 if ev.action == "load"]
    assert loads == ["A", "incumbent"]


@pytest.fixture(scope="module")
def slow_host_run(small_plan, tmp_path_factory) -> tuple[int, dict, Path]:
    out = tmp_path_factory.mktemp("slow") / "out"
    # fifteen times slower loads too (11 minutes): a load deadline above that keeps this about the stop minute
    plan = out.parent / "slow.toml"
    plan.write_text(small_plan.read_text().replace("[timing]", "[timing]\nload_timeout_s = 1200"))
    rc, r = rehearse(plan, out, "--fault", "slow@request=1,factor=15")
    return rc, r, out / "log.db"


def test_slow_host_pushes_phases_past_the_stop_minute_and_the_window_closes_by_its_required_cells(slow_host_run):
    rc, r, _log = slow_host_run
    # in virtual time the slow host's window is the same on every machine: the required cells fit, and
    # the trace arms that would pass the stop minute are deferred by their arm's estimate before they start
    cells = {c["phase"]: c for c in r["cells"]}
    required = ("A.identity", "A.forward_prime", "A.reverse_replay", "B.identity", "B.forward_prime", "B.forward_replay")
    assert [p for p in required if cells[p]["status"] != "measured"] == []
    assert (rc, r["outcome"]) == (0, "completed")
    gated = cells["trace.C1.r1.on"]
    assert gated["status"] == "deferred" and "past the stop minute" in gated["reason"]
    assert cells["trace.C4.r1.on"]["status"] == "deferred" and "frozen trace order ended" in cells["trace.C4.r1.on"]["reason"]
    assert r["restoration"]["verified"]


def test_slow_host_sends_no_experimental_request_at_or_after_the_stop_minute(slow_host_run):
    # A started phase may still overrun its estimate and be cut at minute 70; what the seed forbids
    # is an experimental request sent at or after it, on the window clock of the input that caused
    # the send.
    _rc, _r, log = slow_host_run
    with LogReader(log) as reader:
        envs = list(reader.iter())
    by_seq = {e.seq: e.event() for e in envs}
    t0_mark = next(e for e in envs if e.type == "time_marked" and by_seq[e.seq].mark == "t0")
    t0_ns = by_seq[t0_mark.causation_seq].at_ns
    sent_minutes = [(by_seq[e.causation_seq].at_ns - t0_ns) / 60e9 for e in envs
                    if e.type == "action_requested" and by_seq[e.seq].experimental]
    assert sent_minutes and max(sent_minutes) < 70


# the safety rules beyond contract section 1's fault list (issue 13), each through the real runner
SAFETY_FAULTS = {
    "gpu_memory": ("uncontrolled_growth", "GPU"),
    "resident_creep": ("uncontrolled_growth", "since the incarnation's first observation"),
    "queue_growth": ("uncontrolled_growth", "scheduler queue"),
    "gpu_watch_down": ("watch_lost", "GPU watch"),
    "router_watch_down": ("watch_lost", "router watch"),
    "xid_unsupported": ("watch_lost", "Xid events unsupported"),
    "cache_overflow": ("uncontrolled_growth", "beyond its capacity"),
    # a request that never answers while /health does: cut at the stall bound, not its 600 s deadline
    "request_hang": ("engine_stalled", "no event for 120 s (timing.stall_s), after 0 event(s); /health then answered 200"),
}


@pytest.mark.parametrize("kind", list(SAFETY_FAULTS))
def test_each_safety_rule_fires_through_the_runner_and_the_window_restores(small_plan, tmp_path, kind):
    reason, words = SAFETY_FAULTS[kind]
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", f"{kind}@request=4")
    aborted_and_restored(rc, r, tmp_path / "out" / "log.db")
    assert r["abort"]["reason"] == reason and words in r["abort"]["detail"], r["abort"]


@pytest.fixture(scope="module")
def hang_plan(small_plan, tmp_path_factory) -> Path:
    """The small plan with its stop minute at 20 and deadlines longer than the window: whatever hangs
    at minute 2 is still hanging at the stop minute."""
    p = tmp_path_factory.mktemp("hang") / "hang.toml"
    p.write_text(small_plan.read_text().replace("window_min = 90 ", "window_min = 40 ").replace("stop_min = 70 ", "stop_min = 20 ")
                 .replace("[timing]", "[timing]\naction_timeout_s = 3000\nrequest_timeout_s = 3000\nstall_s = 3000"))
    return p


@pytest.mark.parametrize("kind,action", [("request_hang", "send_request"), ("scrape_hang", "scrape_metrics")])
def test_an_action_hung_at_the_stop_minute_is_cancelled_and_the_restore_finishes_inside_the_reservation(
        hang_plan, tmp_path, kind, action):
    rc, r = rehearse(hang_plan, tmp_path / "out", "--fault", f"{kind}@request=4", "--accept-partial")
    res = r["restoration"]
    assert res["verified"] and rc == 1 and r["outcome"] == "partial", (r["outcome"], res)
    assert 20 <= res["started_minute"] < 20.5 and res["finished_minute"] - res["started_minute"] < 20
    with LogReader(tmp_path / "out" / "log.db") as reader:
        evs = [e.event() for e in reader.iter()]
    hung = [e.action_id for e in evs if type(e).__name__ == "ActionRequested" and e.action == action]
    cancels = [i for e in evs if type(e).__name__ == "CancelRequested" for i in e.action_ids]
    assert set(cancels) & set(hung), "the hung action was not cancelled by the restore"


DRIFT_FIELDS = ("tensor_parallel", "draft_tokens", "host_cache_bytes", "capture_enabled", "gpu_uuid", "gpu_power_limit_w",
                "trace_enabled")


@pytest.mark.parametrize("field", DRIFT_FIELDS)
def test_each_identity_field_drifted_mid_phase_aborts_within_one_request_and_names_no_cause(small_plan, tmp_path, field):
    # the metrics' build labels stay as they were: only the identity endpoint (and the GPU view) shows it
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", f"identity_drift@request=4,field={field}")
    seqs = aborted_and_restored(rc, r, tmp_path / "out" / "log.db")
    assert r["abort"]["reason"] == "identity_drift", r["abort"]
    sent = [ev for _s, ev in seqs if type(ev).__name__ == "ActionRequested" and ev.action == "send_request"]
    assert len(sent) <= 5  # the drift arrived with request 4; at most the one after it was sent
    prime = next(c for c in r["cells"] if c["phase"] == "A.forward_prime")
    assert prime["status"] == "invalid" and prime["identity_held"] is False
    assert r["verdict"]["hypothesis"] == "inconclusive"


def test_a_trace_switch_turned_off_by_someone_else_inside_a_trace_on_arm_aborts_identity_drift(small_plan, tmp_path):
    # the arm set trace on; the host's switch goes off under it: its timings would be an off arm's
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", "identity_drift@trace.C1.r1.on#2,field=trace_enabled,value=false")
    aborted_and_restored(rc, r, tmp_path / "out" / "log.db")
    assert r["abort"]["reason"] == "identity_drift" and "trace_enabled: was True, now False" in r["abort"]["detail"], r["abort"]
    on = next(c for c in r["cells"] if c["phase"] == "trace.C1.r1.on")
    assert on["status"] == "invalid", on


def test_requests_reaching_the_quiesced_engine_around_the_router_invalidate_the_phase_and_abort_containment(small_plan, tmp_path):
    # the router's view stays clean (admitted no, nothing in flight); only the engine's own counters show
    # requests the window did not send, which would have filled its host cache with someone else's state
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", "stray_traffic@A.reverse_replay#2,count=3")
    aborted_and_restored(rc, r, tmp_path / "out" / "log.db")
    assert r["abort"]["reason"] == "containment" and "finished 11 and looked up 11 requests while the window sent 8" \
        in r["abort"]["detail"], r["abort"]
    rev = next(c for c in r["cells"] if c["phase"] == "A.reverse_replay")
    assert rev["status"] == "invalid" and "from outside the window" in rev["reason"], rev
    assert r["verdict"]["hypothesis"] == "inconclusive"


def test_an_engine_that_counts_reuse_its_failed_loads_never_gave_names_no_cause(small_plan, tmp_path):
    # a KV connector whose loads fail while the engine counts what its lookups matched as reused (vLLM's
    # external_kv_transfer counts so): reused tokens above fetched ones; taken at its word, the host tier
    # would show reuse on the reverse replay and none on the forward one, and churn would be named
    shipped = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"  # 52 bodies: the host tier has hits
    rc, r = rehearse(shipped, tmp_path / "out", "--fault", "reuse_miscounted", "--accept-partial")
    rev = next(c for c in r["cells"] if c["phase"] == "A.reverse_replay")
    assert rev["status"] == "invalid" and "counters contradict each other (host reused_tokens" in rev["reason"], rev
    assert r["verdict"]["hypothesis"] == "inconclusive" and r["restoration"]["verified"], r["verdict"]


def test_an_engine_that_answers_beyond_the_bodys_max_tokens_aborts_not_as_sent_and_names_no_cause(tmp_path):
    # a gateway that rewrote max_tokens, or an engine that reads another field: the bodies that would have
    # stopped at their max_tokens generate (and store) four times as much
    shipped = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"  # its bodies reach their max_tokens
    rc, r = rehearse(shipped, tmp_path / "out", "--fault", "max_tokens_ignored")
    aborted_and_restored(rc, r, tmp_path / "out" / "log.db")
    prime = next(c for c in r["cells"] if c["phase"] == "A.forward_prime")
    assert prime["status"] == "invalid" and "more tokens than their body's max_tokens (#" in prime["reason"], prime
    # no later phase would be served as sent either: the window stops there rather than keep the primary out
    assert r["abort"]["reason"] == "not_as_sent" and r["abort"]["detail"].startswith("A.forward_prime: "), r["abort"]
    later = r["cells"][[c["phase"] for c in r["cells"]].index("A.forward_prime") + 1:]
    assert later and all(c["status"] in ("failed", "deferred") and "not_as_sent" in c["reason"]
                         for c in later if not c["phase"].startswith(("nsight", "kernel"))), later
    assert r["verdict"]["hypothesis"] == "inconclusive" and "no cause is named" in r["verdict"]["basis"], r["verdict"]


def test_an_exact_body_counted_at_another_prompt_size_on_the_same_incarnation_aborts_not_as_sent(tmp_path):
    # a gateway in front of the engine puts a system message naming each request before its messages: the
    # same exact body reaches the engine as another prompt each time, and nothing of it is reused
    shipped = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"
    rc, r = rehearse(shipped, tmp_path / "out", "--fault", "prompt_rewritten")
    aborted_and_restored(rc, r, tmp_path / "out" / "log.db")
    rev = next(c for c in r["cells"] if c["phase"] == "A.reverse_replay")
    assert rev["status"] == "invalid" and "another prompt size for" in rev["reason"] \
        and "earlier on incarnation A" in rev["reason"] and "in A.forward_prime #" in rev["reason"], rev
    assert r["abort"]["reason"] == "not_as_sent" and r["abort"]["detail"].startswith("A.reverse_replay: "), r["abort"]
    b = next(c for c in r["cells"] if c["phase"] == "B.forward_replay")
    assert b["status"] == "failed" and "not_as_sent" in b["reason"], b  # the B arm never took the primary out again
    assert r["verdict"]["hypothesis"] == "inconclusive" and "no cause is named" in r["verdict"]["basis"], r["verdict"]


def test_a_gateway_answering_exact_bodies_from_its_store_aborts_not_as_sent_naming_no_cause(tmp_path):
    # a gateway in front of the engine answers an exact body it answered before from its store: the reverse
    # replay's bodies are the forward prime's, so the engine sees none of them and its reuse reads 0
    shipped = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"
    rc, r = rehearse(shipped, tmp_path / "out", "--fault", "response_cache")
    aborted_and_restored(rc, r, tmp_path / "out" / "log.db")
    rev = next(c for c in r["cells"] if c["phase"] == "A.reverse_replay")
    assert rev["status"] == "invalid" and "with an answer an earlier request on incarnation A already had" in rev["reason"] \
        and "A.forward_prime #51's answer 'req-" in rev["reason"], rev
    assert r["abort"]["reason"] == "not_as_sent" and r["abort"]["detail"].startswith("A.reverse_replay: "), r["abort"]
    assert r["verdict"]["hypothesis"] == "inconclusive" and "no cause is named" in r["verdict"]["basis"], r["verdict"]


def test_a_request_said_to_have_more_cached_tokens_than_its_prompt_invalidates_the_phase(small_plan, tmp_path):
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", "cached_overstated@A.reverse_replay#0", "--accept-partial")
    rev = next(c for c in r["cells"] if c["phase"] == "A.reverse_replay")
    assert rev["status"] == "invalid" and "more tokens were cached than their prompt has (#0: cached_tokens" in rev["reason"], rev
    assert r["restoration"]["verified"], r["restoration"]


def test_a_host_cache_that_outlives_the_engine_leaves_nothing_measured_on_the_incarnation_it_was_not_empty_for(tmp_path):
    # the host cache is a store outside the engine: B loads with the entries A left, and its gauges say
    # nothing of them; B's cold prime finds them at its first request. The shipped plan's 52 bodies: A's
    # reverse replay reuses host tokens, so only B's forward replay could decide
    shipped = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"
    rc, r = rehearse(shipped, tmp_path / "out", "--fault", "cache_outlives_load")
    cells = {c["phase"]: c for c in r["cells"]}
    assert "host cache occupancy not observable on this target" in cells["B.identity"]["reason"]
    assert cells["A.forward_prime"]["status"] == "measured", cells["A.forward_prime"]
    prime = cells["B.forward_prime"]
    assert prime["status"] == "invalid" and "verified fresh, was not empty: its first request found" in prime["reason"], prime
    later = [c for p, c in cells.items() if p.startswith(("B.", "trace.")) and p not in ("B.identity", "B.forward_prime")]
    assert later and all(c["status"] == "invalid" and c["reason"].startswith("incarnation B not verified fresh") for c in later)
    assert (rc, r["outcome"]) == (1, "partial") and r["restoration"]["verified"]
    assert r["verdict"]["hypothesis"] == "inconclusive", r["verdict"]
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]


def test_a_store_the_incumbents_traffic_left_warm_ends_the_window_before_b_with_the_primary_back(tmp_path):
    # the store outside the engine holds what the incumbent served of the bodies: A's cold prime finds them at
    # its first request and sends no more; no verdict can come of B, which would load on the same store
    shipped = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"
    rc, r = rehearse(shipped, tmp_path / "out", "--fault", "cache_outlives_load,served=c1-52")
    cells = {c["phase"]: c for c in r["cells"]}
    assert (cells["A.forward_prime"]["status"], cells["A.forward_prime"]["requests"]) == ("invalid", 1), cells["A.forward_prime"]
    assert all(cells[p]["status"] == "deferred" for p in ("B.identity", "B.forward_prime", "B.forward_replay"))
    assert r["verdict"]["next_experiment"].startswith("Repeat the window, each arm on an incarnation that starts cold")
    assert (rc, r["outcome"], r["restoration"]["verified"]) == (1, "partial", True)
    assert r["restoration"]["finished_minute"] < 10, r["restoration"]  # the primary back within minutes, not at 58
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]


def test_a_store_said_to_hold_a_fixture_the_simulator_lacks_is_refused_naming_the_fixtures(tmp_path):
    rc, out, err = flare_diag_here("rehearse", "--out", str(tmp_path / "out"), "--fault", "cache_outlives_load,served=nope")
    assert rc == 2 and "served: expected a fixture's name, one of c1-52, peer-30, tok1024, got 'nope'" in err, (out, err)


def test_a_restore_read_that_gets_no_answer_is_not_followed_by_a_health_ask_that_would_spend_the_reservation(
        small_plan, tmp_path):
    # the first scrape after the incumbent's load (the third load: A, B, then the restore's) hangs past its deadline
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", "scrape_hang@after_load=3")
    with LogReader(tmp_path / "out" / "log.db") as reader:
        evs = [e.event() for e in reader.iter()]
    restore_at = next(i for i, e in enumerate(evs) if type(e).__name__ == "RestoreStarted")
    timed_out = [e for e in evs[restore_at:] if type(e).__name__ == "ActionDone" and e.error == "timeout"]
    assert timed_out, "no restore read timed out: the test shows nothing"
    assert all(e.health_after is None for e in timed_out), [(e.action_id, e.health_after) for e in timed_out]
    assert r["restoration"]["within_reservation"], r["restoration"]


def test_monitoring_that_shows_the_restored_incumbent_healthy_a_scrape_later_is_waited_for(small_plan, tmp_path):
    # monitoring shows the incumbent healthy 90 s after its load: read again after the readmission (up to 120 s)
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", "monitoring_lag,duration_s=90", "--accept-partial")
    rest = r["restoration"]
    assert rest["monitoring_registered"] is True and rest["verified"] and rest["readmitted"], (rest, r["alarms"])
    assert rc in (0, 1) and r["outcome"] in ("completed", "partial")


def test_monitoring_that_never_shows_the_restored_incumbent_healthy_is_named_and_fails_the_restore(small_plan, tmp_path):
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", "monitoring_lag,duration_s=3600")
    rest = r["restoration"]
    assert (rc, r["outcome"], rest["monitoring_registered"], rest["readmitted"]) == (3, "restore_failed", False, True), rest
    said = next(a["detail"] for a in r["alarms"] if a["kind"] == "monitoring_not_healthy")
    assert said.endswith("within 120 s of the restore: target primary registered True, healthy False"), said


def test_a_readmit_the_router_applies_seconds_after_answering_it_is_verified_when_it_is_applied(small_plan, tmp_path):
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", "readmit_lag,duration_s=12", "--accept-partial")
    rest = r["restoration"]
    assert rest["readmitted"] is True and rest["verified"], (rest, r["alarms"])
    assert "readmit_not_verified" not in [a["kind"] for a in r["alarms"]]
