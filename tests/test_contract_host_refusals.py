"""Refusals, half restores, stranding bounds and scaled clocks through the real runner, on the contract host."""

from __future__ import annotations

import json

from flare_diag.events.reader import LogReader
from tests.contract_tools import ContractHost, host_changes
from tests.test_contract_host import _without_trace, flare_diag, run_window



def _window(tmp_path, plan, **host):
    h = ContractHost(tmp_path / "host", cache_entries=4, **host)
    try:
        rc, r = run_window(h, tmp_path / "out", plan)
        seen = h.requests()
    finally:
        h.stop()
    return rc, r, seen


def test_a_host_that_refuses_every_body_aborts_rejected_before_b_is_loaded(tmp_path, small_plan):
    # an older release whose schema has no reasoning_effort "low" (the eight-body plan's bodies ask it): every body is refused
    rc, r, seen = _window(tmp_path, _without_trace(small_plan, tmp_path), reject_value={"reasoning_effort": "low"})
    assert (rc, r["outcome"], r["abort"]["reason"]) == (1, "aborted", "rejected"), (r["abort"], r["alarms"])
    detail = r["abort"]["detail"]
    assert "HTTP 400" in detail and "A.forward_prime #0" in detail and "reasoning_effort" in detail
    chats = [x for x in seen if x.get("path") == "/v1/chat/completions" and x["service"] == "serving"]
    loads = [x for x in seen if x.get("path") == "/manager/v1/load"]
    assert len(loads) == 2  # candidate A, then the incumbent back: B never loaded
    assert len(chats) == 3 + 1  # the streak, then the restore's direct preflight (which has no such value)
    assert r["verdict"]["hypothesis"] == "inconclusive" and r["restoration"]["verified"]
    assert {c["phase"]: c["status"] for c in r["cells"]}["B.forward_prime"] == "failed"


def test_one_refused_body_fails_its_request_and_the_window_goes_on(tmp_path, small_plan):
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), reject_nth=[3])
    assert r["abort"] is None, r["abort"]
    cell = next(c for c in r["cells"] if c["phase"] == "A.forward_prime")
    assert cell["status"] == "failed" and "1 of 8 requests failed: #2: http_400" in cell["reason"]
    assert next(c for c in r["cells"] if c["phase"] == "B.forward_replay")["status"] == "measured"
    assert rc == 0 or r["outcome"] == "partial"


def test_a_stream_that_splices_in_a_second_answer_aborts_the_window_naming_the_request(tmp_path, small_plan):
    # the third request's stream goes on under another completion id after its third event, as a router
    # that resumed the generation on a second backend: its times and text are no one generation's
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), splice_nth=[3])
    assert (rc, r["outcome"], r["abort"] and r["abort"]["reason"]) == (1, "aborted", "malformed_transport"), r["abort"]
    detail = r["abort"]["detail"]
    assert detail.startswith("A.forward_prime #2 (action") and "two answers in one stream" in detail, detail
    assert r["verdict"]["hypothesis"] == "inconclusive" and r["restoration"]["verified"]


def test_an_engine_that_dies_as_its_load_is_answered_is_lost_at_its_identity_phase(tmp_path, small_plan):
    # the first candidate incarnation (c2) loads, and its engine is gone before the identity phase reads it
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), crash_after_load="c2")
    assert (r["outcome"], r["abort"] and r["abort"]["reason"]) == ("aborted", "engine_lost"), r["abort"]
    assert r["abort"]["detail"].startswith("A.identity: the identity at the phase's start shows no incarnation"), r["abort"]
    assert "/health answered 503" in r["abort"]["detail"]
    cells = {c["phase"]: c for c in r["cells"]}
    assert cells["A.identity"]["status"] == "failed" and "during this phase" in cells["A.identity"]["reason"]
    assert r["verdict"]["hypothesis"] == "inconclusive" and r["restoration"]["verified"] and rc == 1, r["restoration"]


def test_an_engine_that_dies_under_a_stream_is_lost_by_the_identity_watch_not_drifted(tmp_path, small_plan):
    # the third request's engine dies after its first event and the stream hangs: only the identity watch,
    # which finds no incarnation and asks /health, can see it before the request's own deadline
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), die_mid_chat=3)
    assert (r["outcome"], r["abort"] and r["abort"]["reason"]) == ("aborted", "engine_lost"), r["abort"]
    assert r["abort"]["detail"] == ("A.forward_prime: identity watch shows no incarnation loaded and "
                                    "/health answered 503"), r["abort"]
    assert r["verdict"]["hypothesis"] == "inconclusive" and r["restoration"]["verified"] and rc == 1, r["restoration"]


def test_a_gateway_answering_from_its_store_of_answers_aborts_not_as_sent_naming_no_cause(tmp_path, small_plan):
    # the reverse replay's exact bodies were answered in the forward prime: the gateway gives those answers
    # again and the engine never sees the bodies (the window used to complete, blaming key eligibility)
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), response_cache=True)
    assert (rc, r["outcome"], r["abort"] and r["abort"]["reason"]) == (1, "aborted", "not_as_sent"), r["abort"]
    detail = r["abort"]["detail"]
    assert detail.startswith("A.reverse_replay: the host answered 8 of 8 requests with an answer an earlier request"), detail
    assert "#0: A.forward_prime #7's answer 'c-" in detail
    assert r["verdict"]["hypothesis"] == "inconclusive" and r["restoration"]["verified"]


def test_a_gateway_that_names_its_stored_answers_anew_is_caught_by_the_engines_finished_count(tmp_path, small_plan):
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), response_cache="new_id")
    assert (rc, r["abort"] and r["abort"]["reason"]) == (1, "not_as_sent"), r["abort"]
    assert r["abort"]["detail"].startswith("A.reverse_replay: the engine counted 0 requests finished during the phase "
                                           "while 8 were answered: 8 answers are not in its count"), r["abort"]
    assert r["verdict"]["hypothesis"] == "inconclusive"


def test_metrics_read_from_an_idle_twin_of_the_engine_abort_not_as_sent_before_any_cause(tmp_path, small_plan):
    # the site's monitoring names another replica: its counters never move, so every phase would read no reuse
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), metrics_twin=True)
    assert (rc, r["abort"] and r["abort"]["reason"]) == (1, "not_as_sent"), (r["abort"], r["verdict"])
    assert r["abort"]["detail"].startswith("A.forward_prime: the engine counted 0 requests finished during the phase "
                                           "while 8 were answered"), r["abort"]
    assert r["verdict"]["hypothesis"] == "inconclusive" and r["restoration"]["verified"]


def test_without_a_finished_count_the_engines_generated_tokens_catch_metrics_from_an_idle_twin(tmp_path, small_plan):
    # as llama.cpp, which exports no count of finished requests: its tokens generated are held to the answers'
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), metrics_twin=True,
                           omit_metrics=["flare_requests_finished"])
    assert (rc, r["abort"] and r["abort"]["reason"]) == (1, "not_as_sent"), (r["abort"], r["verdict"])
    assert r["abort"]["detail"].startswith("A.forward_prime: the engine counted 0 tokens generated during the phase "
                                           "while its 8 answers say "), r["abort"]
    assert r["verdict"]["hypothesis"] == "inconclusive" and r["restoration"]["verified"]


def test_a_trace_left_on_by_an_aborted_trace_arm_is_set_back_and_only_then_verified(tmp_path, small_plan):
    # the host keeps its trace switch across loads; an identity drift aborts the window inside the
    # first trace-on arm: B's prime 8, replay 8, small control 16, warm-up 8 and C1 r1 off 8 come first
    rc, r, seen = _window(tmp_path, small_plan, trace_survives_load=True,
                          drift={"after": 52, "field": "draft_tokens", "value": 3})
    assert r["abort"] and r["abort"]["reason"] == "identity_drift", r["abort"]
    assert r["abort"]["detail"].startswith("trace.C1.r1.on"), r["abort"]
    toggles = [x for x in seen if x.get("path") == "/flare/v1/trace"]
    assert len(toggles) >= 2, "the window never turned a trace on: the test tested nothing"
    res = r["restoration"]
    assert res["identity_restored"] is True and res["verified"] and rc == 1, res


def test_a_gpu_memory_breach_while_the_incumbent_loads_keeps_the_primary_out_exit_3(tmp_path, small_plan):
    rc, r, seen = _window(tmp_path, _without_trace(small_plan, tmp_path), load_delay_s=1.0,
                          gpu_memory_on_load=141 << 30)  # all of it: over the plan's 0.995
    assert (rc, r["outcome"]) == (3, "restore_failed"), (r["restoration"], r["alarms"])
    assert r["restoration"]["readmitted"] is False
    assert [a for a in r["alarms"] if a["kind"] == "fault_during_restore" and "memory" in a["detail"]]
    assert not [x for x in seen if x.get("path", "").endswith("/readmit")]


def test_a_bound_the_healthy_incumbent_already_breaches_is_refused_with_no_host_change(tmp_path, small_plan):
    plan = tmp_path / "tight.toml"
    text = small_plan.read_text()
    assert "max_gpu_memory_fraction = 0.995" in text
    plan.write_text(text.replace("max_gpu_memory_fraction = 0.995", "max_gpu_memory_fraction = 0.3"))
    h = ContractHost(tmp_path / "host", cache_entries=4)
    try:
        p = flare_diag("run", "--plan", str(plan), "--site", str(h.site), "--out", str(tmp_path / "out"),
                       "--time-scale", "60")
        seen = h.requests()
    finally:
        h.stop()
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "growth.max_gpu_memory_fraction = 0.3" in p.stderr and "already uses 0.355" in p.stderr
    assert not host_changes(seen, chats=False)
    assert not [x for x in seen if x.get("path") == "/v1/chat/completions"]


def test_run_refuses_a_manager_busy_with_someone_elses_load_before_anything_starts(tmp_path, small_plan):
    h = ContractHost(tmp_path / "host", cache_entries=4, manager_busy_from=1)
    try:
        p = flare_diag("run", "--plan", str(_without_trace(small_plan, tmp_path)), "--site", str(h.site),
                       "--out", str(tmp_path / "out"), "--time-scale", "60")
        seen = h.requests()
    finally:
        h.stop()
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "a load or unload is in progress (busy)" in p.stderr, p.stderr
    assert not (tmp_path / "out" / "report.json").exists() and not host_changes(seen)


def test_a_manager_that_turns_busy_after_the_site_check_is_refused_at_preflight_with_no_host_change(tmp_path, small_plan):
    # someone else's load starts between `run`'s site check (the first state read) and the window's own look
    rc, r, seen = _window(tmp_path, _without_trace(small_plan, tmp_path), manager_busy_from=2)
    assert (rc, r["outcome"], r["abort"]["reason"]) == (1, "aborted", "preflight"), r["abort"]
    assert "load or unload in progress (busy)" in r["abort"]["detail"]
    assert not host_changes(seen, chats=False)  # no quiesce, unload, load or trace switch: only reads and preflights


def test_a_contract_host_whose_candidate_load_never_answers_gets_no_later_load_and_is_restored(tmp_path, small_plan):
    # the manager's first load (the candidate as A) never answers and it stays busy starting that engine
    rc, r, seen = _window(tmp_path, _without_trace(small_plan, tmp_path), hang_load=1)
    assert (rc, r["outcome"], r["abort"]) == (1, "partial", None), (r["abort"], r["alarms"])
    assert {c["phase"]: c["status"] for c in r["cells"]}["B.forward_replay"] == "failed"
    assert "the manager then showed a load or unload still running" in next(
        c["reason"] for c in r["cells"] if c["phase"] == "B.identity")
    loads = [x for x in seen if x.get("path") == "/manager/v1/load"]
    assert len(loads) == 2 and r["restoration"]["verified"]  # A's, then the incumbent's: none over A's start


def test_at_x60_the_raised_bounds_are_in_scaled_bounds_and_under_needs_attention(tmp_path, small_plan):
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path))
    raised = {b["bound"]: b for b in r["scaled_bounds"]}
    assert raised["timing.watch_lost_s"] == {"bound": "timing.watch_lost_s", "plan_s": 30.0, "effective_s": 300.0,
                                             "reason": raised["timing.watch_lost_s"]["reason"]}
    assert "5 real s" in raised["timing.watch_lost_s"]["reason"]
    md = (tmp_path / "out" / "report.md").read_text()
    head = md[md.index("Needs attention"):]
    assert "timing.watch_lost_s held at 300 window s, not the plan's 30" in head
    with LogReader(tmp_path / "out" / "log.db") as reader:
        kinds = [type(e.event()).__name__ for e in reader.iter()]
    assert "BoundsScaled" in kinds and rc == 0


def test_a_gpu_view_silent_through_the_restore_says_the_containment_it_could_not_verify_and_why(tmp_path, small_plan):
    # from A's third request the GPU view answers 503 for longer than the window; at x60 the watch's bound is
    # 300 window s, which the experiment does not outlast: the restore meets the silent view
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), gpu_silent={"after_chats": 3, "for_s": 600})
    assert (rc, r["outcome"], r["restoration"]["containment"]) == (3, "restore_failed", False), (r["abort"], r["restoration"])
    said = next(a["detail"] for a in r["alarms"] if a["kind"] == "containment_not_verified")
    assert said.startswith("the GPU view could not be read (") and "503" in said, said
    assert "router" not in said  # the router was read and unchanged: it is not named


def test_at_x6_a_gpu_view_that_falls_silent_aborts_watch_lost_within_the_plans_30_window_seconds(tmp_path, small_plan):
    # loads take 4 real s (24 window s), so the experiment outlasts 30 window s (5 real s) of silence from
    # A's third request, whatever the machine's speed (slower only lengthens it); the view answers again
    # 7.5 real s in, before the restore (an unload and a 4-s load after the abort) reads it
    h = ContractHost(tmp_path / "host", cache_entries=4, load_delay_s=4.0, gpu_silent={"after_chats": 3, "for_s": 7.5})
    try:
        p = flare_diag("run", "--plan", str(_without_trace(small_plan, tmp_path)), "--site", str(h.site),
                       "--out", str(tmp_path / "out"), "--time-scale", "6")
    finally:
        h.stop()
    r = json.loads((tmp_path / "out" / "report.json").read_text())
    assert r["abort"]["reason"] == "watch_lost" and "over 30 s" in r["abort"]["detail"], (r["abort"], p.stderr[-800:])
    assert not [b for b in r["scaled_bounds"] if b["bound"] == "timing.watch_lost_s"]
    with LogReader(tmp_path / "out" / "log.db") as reader:
        events = [e.event() for e in reader.iter()]
    gpu = [e.at_ns for e in events if type(e).__name__ == "WatchObserved" and e.source == "gpu"]
    aborted = next(i for i, e in enumerate(events) if type(e).__name__ == "AbortDecided")
    decided_at = next(e.at_ns for e in reversed(events[:aborted]) if hasattr(e, "at_ns"))
    last_answer = max(t for t in gpu if t <= decided_at)
    # the silence is judged against the plan's 30 s from the last answer (not the 300 of x60); a busy
    # machine's late tick may add real seconds, never the 270 window s a raised bound would
    assert 30 * 10**9 < decided_at - last_answer < 60 * 10**9
    assert r["restoration"]["verified"] and p.returncode == 1


def _stall_bound(plan, folder, stall_s: float):
    """The plan with `[timing] stall_s` set."""
    out = folder / "stall.toml"
    out.write_text(plan.read_text().replace("[timing]\n", f"[timing]\nstall_s = {stall_s:g}\n", 1))
    return out


def test_an_engine_that_hangs_under_a_stream_while_healthy_aborts_engine_stalled_at_the_stall_bound(tmp_path, small_plan):
    # the third request's stream stops after its first event while /health, the identity and the metrics all
    # answer (a hung collective): only the stream's silence shows it. Before the bound, the request waited out
    # its 600 s deadline and the phase went on sending into the same engine
    plan = _stall_bound(_without_trace(small_plan, tmp_path), tmp_path, 3)
    rc, r, seen = _window(tmp_path, plan, hang_mid_chat=3)
    assert (rc, r["outcome"], r["abort"] and r["abort"]["reason"]) == (1, "aborted", "engine_stalled"), r["abort"]
    detail = r["abort"]["detail"]
    assert detail.startswith("A.forward_prime #2 (action ") and detail.endswith(
        ": chat completion: no event for 300 s (timing.stall_s 3 s, raised by the scaled clock's real-seconds floor), "
        "after 1 event(s); /health then answered 200"), detail
    assert {"bound": "timing.stall_s", "plan_s": 3.0, "effective_s": 300.0,
            "reason": "a stream's silence is timed in real time: it is given at least 5 real s, x60"} in r["scaled_bounds"]
    loads = [i for i, x in enumerate(seen) if x.get("path") == "/manager/v1/load"]
    chats = [x for x in seen[:loads[-1]] if x.get("path") == "/v1/chat/completions" and x["service"] == "serving"]
    assert len(chats) == 3  # nothing more was sent into the hung engine before the incumbent was loaded back
    cells = {c["phase"]: c for c in r["cells"]}
    assert cells["A.forward_prime"]["status"] == "invalid" and "window aborted (engine_stalled)" in cells["A.forward_prime"]["reason"]
    assert r["verdict"]["hypothesis"] == "inconclusive" and r["restoration"]["verified"], r["restoration"]


def test_a_stream_that_goes_on_past_its_bodys_max_tokens_is_cut_there_and_aborts_not_as_sent(tmp_path, small_plan):
    # an engine that reads another field than max_tokens (the third request's stream goes on, one token an event):
    # cut after max_tokens and the slack, where it used to run to the request's 600 s deadline
    rc, r, seen = _window(tmp_path, _without_trace(small_plan, tmp_path), runaway_chat=3)
    assert (rc, r["outcome"], r["abort"] and r["abort"]["reason"]) == (1, "aborted", "not_as_sent"), r["abort"]
    detail = r["abort"]["detail"]
    assert detail.startswith("A.forward_prime #2 (action ") and detail.endswith(
        ": chat completion: the stream went on past 1,056 events for a body whose max_tokens is 1,024: the engine "
        "did not stop at it"), detail
    assert r["verdict"]["hypothesis"] == "inconclusive" and "no cause is named" in r["verdict"]["basis"], r["verdict"]
    assert r["restoration"]["verified"], r["restoration"]


def test_an_incumbent_that_holds_its_preflight_fails_the_restore_at_the_stall_bound_not_the_reserves_end(tmp_path, small_plan):
    # the incumbent loaded back takes its preflight and says nothing more while /health, the identity and the
    # metrics answer (its collective hung as it started serving). Not streamed, the preflight got no byte before
    # its deadline, the rest of the reserve under a 30-minute request bound: the restore failed at the window's end
    plan = _stall_bound(_without_trace(small_plan, tmp_path), tmp_path, 3)
    plan.write_text(plan.read_text().replace("[timing]\n", "[timing]\nrequest_timeout_s = 1800\n", 1))
    rc, r, _seen = _window(tmp_path, plan, hang_incumbent_reload=True)
    rest = r["restoration"]
    assert (rc, r["outcome"], rest["direct_preflight"], rest["readmitted"]) == (3, "restore_failed", False, False), rest
    assert rest["incumbent_sha256_match"] is True  # the incumbent is back; it does not serve
    said = next(a["detail"] for a in r["alarms"] if a["kind"] == "direct_preflight_failed")
    assert said == ("the incumbent is back but does not serve: direct preflight: no event for 300 s (timing.stall_s 3 s, "
                    "raised by the scaled clock's real-seconds floor), after 1 event(s)"), said
    # the stall bound is 5 window minutes (5 real s at x60); the deadline left the preflight the whole 20-minute
    # reserve, which a slow machine's real seconds (a window minute each here) cannot stretch this restore to
    assert rest["finished_minute"] - rest["started_minute"] < 19, rest


def test_a_stream_the_engine_ended_itself_as_abort_is_a_failed_request_not_a_measured_one(tmp_path, small_plan):
    # SGLang ends a gracefully aborted request (its /abort_request) with finish_reason "abort" in an ordinary last
    # chunk, usage and [DONE] included: read at its word it was a whole answer, and its phase measured
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), abort_nth=[3])
    cells = {c["phase"]: c for c in r["cells"]}
    cell = cells["A.forward_prime"]
    assert cell["status"] == "failed" and "1 of 8 requests failed: #2: engine_error" in cell["reason"], cell
    assert r["abort"] is None and cells["B.forward_replay"]["status"] == "measured", r["abort"]  # the window goes on
    failed = [q for q in r["requests"] if q["phase"] == "A.forward_prime" and q["outcome"] != "ok"]
    assert [q["order_index"] for q in failed] == [2]


def test_monitoring_that_shows_the_restored_incumbent_healthy_a_scrape_later_does_not_fail_the_restore(tmp_path, small_plan):
    # monitoring lists the primary unhealthy for two real seconds after the incumbent is back (its last scrape
    # was the failed one, while the engine was down): one read at the restore called it restore_failed, exit 3
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), monitoring_lag_s=2)
    rest = r["restoration"]
    assert (rc, r["outcome"], rest["verified"], rest["monitoring_registered"], rest["readmitted"]) == \
        (0, "completed", True, True, True), (rest, r["alarms"])
    assert "monitoring_not_healthy" not in [a["kind"] for a in r["alarms"]]


def test_monitoring_that_never_shows_the_restored_incumbent_healthy_fails_the_restore_saying_what_it_showed(
        tmp_path, small_plan):
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), monitoring_lag_s=3600)
    rest = r["restoration"]
    assert (rc, r["outcome"], rest["monitoring_registered"], rest["readmitted"]) == (3, "restore_failed", False, True), rest
    said = next(a["detail"] for a in r["alarms"] if a["kind"] == "monitoring_not_healthy")
    assert said == ("monitoring did not show the incumbent registered and healthy within 300 s of the restore: "
                    "target primary registered True, healthy False"), said


def test_a_restore_whose_identity_read_fails_once_as_the_engine_comes_up_reads_it_again_and_readmits(tmp_path, small_plan):
    # the first two identity reads after the incumbent is back answer 503: one read decided incumbent_sha256_match,
    # and the restored incumbent was left out of rotation (restore_failed, exit 3) for a person
    rc, r, seen = _window(tmp_path, _without_trace(small_plan, tmp_path), flaky_after_restore={"identity": 2})
    rest = r["restoration"]
    assert (rc, r["outcome"], rest["incumbent_sha256_match"], rest["readmitted"], rest["verified"]) == \
        (0, "completed", True, True, True), (rest, r["alarms"])
    back = max(i for i, x in enumerate(seen) if x.get("path") == "/manager/v1/load")
    reads = [x for x in seen[back:] if x.get("path") == "/flare/v1/identity"]
    assert len(reads) >= 3  # two refused, then the one that answered


def test_a_router_that_applies_a_readmit_a_moment_after_answering_it_is_read_again_and_the_restore_verifies(
        tmp_path, small_plan):
    # the readmit is answered admitted and applied a second later (a configuration pushed to the router's proxies):
    # one read of its backends right after it called the readmission not verified (restore_failed, exit 3)
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), readmit_applied_after_s=1)
    rest = r["restoration"]
    assert (rc, r["outcome"], rest["readmitted"], rest["verified"]) == (0, "completed", True, True), (rest, r["alarms"])
    assert "readmit_not_verified" not in [a["kind"] for a in r["alarms"]]


def test_a_restored_incumbent_that_refuses_its_first_preflight_while_warming_is_asked_again_and_readmitted(
        tmp_path, small_plan):
    # the incumbent's first generation after its load answers 503 (an engine still warming up behind a manager that
    # answered the load already): one preflight decided direct_preflight, and the primary was left out of rotation
    rc, r, _seen = _window(tmp_path, _without_trace(small_plan, tmp_path), flaky_after_restore={"chat": 1})
    rest = r["restoration"]
    assert (rc, r["outcome"], rest["direct_preflight"], rest["readmitted"], rest["verified"]) == \
        (0, "completed", True, True, True), (rest, r["alarms"])


def test_an_incumbent_load_refused_while_the_manager_releases_the_candidate_is_sent_again_a_moment_later(
        tmp_path, small_plan):
    # the manager refuses loads of the incumbent for two real seconds after the candidate's unload: the second
    # attempt went out at once, was refused too, and the restore failed with the primary left out of rotation
    rc, r, seen = _window(tmp_path, _without_trace(small_plan, tmp_path), busy_after_unload_s=2)
    rest = r["restoration"]
    assert (rc, r["outcome"], rest["incumbent_sha256_match"], rest["verified"]) == (0, "completed", True, True), \
        (rest, r["alarms"])
    last_unload = max(i for i, x in enumerate(seen) if x.get("path") == "/manager/v1/unload")
    assert len([x for x in seen[last_unload:] if x.get("path") == "/manager/v1/load"]) == 2  # refused, then loaded
