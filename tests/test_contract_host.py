"""The window against a second Flare host written from contract.md alone (tests/contract_host.py).

Nothing here is flaresim: five services on five ports, replies with exactly the contract's fields, a
plain LRU of full-prompt checkpoints. Where this host and flaresim disagree, the contract decides.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flare_diag.events.reader import LogReader
from tests.contract_tools import PLAN, ROOT, ContractHost, host_changes
from tests.reviewtools import with_review

SCALE = "60"
MUTATING = ("/manager/v1/load", "/manager/v1/unload", "/quiesce", "/readmit", "/flare/v1/trace", "/v1/chat/completions")


def flare_diag(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The CLI; a `run` gets a review of its plan (tests/reviewtools.py), as a production plan needs."""
    return subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", *with_review(list(args))], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


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
    whose cache holds fewer entries than that, and whose every answer sets a cookie, read by the tests below."""
    tmp = tmp_path_factory.mktemp("churn")
    h = ContractHost(tmp / "host", cache_entries=4, set_cookie=True)
    try:
        rc, r = run_window(h, tmp / "out", _without_trace(small_plan, tmp))
    finally:
        h.stop()
    return rc, r, tmp / "out", h.requests()


def test_a_churning_contract_host_gives_row_checkpoint_churn(churn_window):
    rc, r, _out, _seen = churn_window
    assert rc == 0 and r["outcome"] == "completed", (r["abort"], r["restoration"], r["alarms"])
    assert set(required_cells(r).values()) == {"measured"}
    assert r["verdict"]["hypothesis"] == "row_checkpoint_churn"
    assert r["restoration"]["verified"] and r["restoration"]["incumbent_sha256_match"]
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]


def _window_without_trace(tmp_path: Path, small_plan: Path, **cfg: Any) -> tuple[int, dict, list[dict]]:
    """`run` of the small plan without its trace arms on a contract host set up with `cfg`: (exit code, report,
    the requests the host saw), the host stopped after."""
    host = ContractHost(tmp_path / "host", **cfg)
    try:
        rc, r = run_window(host, tmp_path / "out", _without_trace(small_plan, tmp_path))
        return rc, r, host.requests()
    finally:
        host.stop()


def test_a_contract_host_whose_cache_holds_the_working_set_gives_not_reproduced(tmp_path, small_plan):
    rc, r, _seen = _window_without_trace(tmp_path, small_plan, cache_entries=500)
    assert rc == 0 and r["outcome"] == "completed", (r["abort"], r["restoration"], r["alarms"])
    assert set(required_cells(r).values()) == {"measured"}
    assert r["verdict"]["hypothesis"] == "not_reproduced"


def test_a_cookie_the_host_sets_never_rides_on_a_later_request(churn_window):
    """The window's requests are the plan's and nothing a host handed back: a sticky-session cookie
    would pin the routed path to a backend, and would differ between one window's requests and another's."""
    _rc, _r, _out, seen = churn_window
    answered = [x for x in seen if not x.get("dropped")]
    assert len({x["service"] for x in answered}) == 5  # every service set its cookie and was asked again
    assert [x for x in answered if "cookie" in x] == []


def test_recipe_bytes_are_retained_by_hash_and_every_load_names_that_hash(churn_window):
    import hashlib
    _rc, r, out, _seen = churn_window
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
    # every generation the host served is one the log holds: the window's requests and its preflights
    assert len(chats) == len(sent) + len(direct)


def _count_generations(host: ContractHost, log: Path) -> tuple[int, int, list]:
    chats = [x for x in host.requests() if x.get("path") == "/v1/chat/completions" and not x.get("dropped")]
    with LogReader(log) as reader:
        events = [e.event() for e in reader.iter()]
    sends = [e for e in events if type(e).__name__ == "ActionRequested" and e.action in ("send_request", "preflight")]
    probes = [e for e in events if type(e).__name__ == "ProbeRequest"]
    return len(chats), len(sends) + len(probes), probes


def test_run_sends_no_generation_that_is_not_in_the_log(tmp_path, small_plan):
    host = ContractHost(tmp_path / "host", cache_entries=4)
    try:
        rc, _r = run_window(host, tmp_path / "out", _without_trace(small_plan, tmp_path))
        served, logged, probes = _count_generations(host, tmp_path / "out" / "log.db")
    finally:
        host.stop()
    assert rc == 0 and served == logged and not probes  # no pace probe unless the site opts in


def test_a_site_that_opts_in_to_pace_probing_gets_at_most_the_plans_probes_each_logged(tmp_path, small_plan):
    host = ContractHost(tmp_path / "host", cache_entries=4)
    with open(host.site, "a") as f:
        f.write("[forecast]\nprobe_requests = 16\n")
    plan = _without_trace(small_plan, tmp_path)
    plan.write_text(plan.read_text().replace("load_s = 60 ", "load_s = 60\nprobe_requests = 3 "))
    try:
        rc, r = run_window(host, tmp_path / "out", plan)
        served, logged, probes = _count_generations(host, tmp_path / "out" / "log.db")
    finally:
        host.stop()
    assert rc == 0 and served == logged and len(probes) == 3, (served, logged, len(probes))
    assert all(p.outcome == "ok" and p.body_sha256 for p in probes)
    # each probe request in the log before it went out (probe_sent), its answer after: intent, then outcome
    with LogReader(tmp_path / "out" / "log.db") as reader:
        trail = [(type(e).__name__, e.body_index) for e in (x.event() for x in reader.iter())
                 if type(e).__name__ in ("ProbeSent", "ProbeRequest")]
    assert trail == [(kind, p.body_index) for p in probes for kind in ("ProbeSent", "ProbeRequest")]


def test_site_check_passes_on_the_contract_host(churning_host):
    p = flare_diag("site", "check", str(churning_host.site), "--plan", str(PLAN))
    assert p.returncode == 0, p.stdout
    assert p.stdout.splitlines()[-1].startswith("site check: ready")
    seen = churning_host.requests()
    assert [x for x in seen if "trace_set" in x] and not host_changes(seen)


def _site_check(tmp_path: Path, **cfg: Any) -> subprocess.CompletedProcess:
    """`site check --json` with the shipped plan on a contract host set up with `cfg`, the host stopped after."""
    host = ContractHost(tmp_path / "host", **cfg)
    try:
        return flare_diag("site", "check", str(host.site), "--plan", str(PLAN), "--json")
    finally:
        host.stop()


def test_site_check_calls_a_trace_switch_that_answers_404_not_observable(tmp_path):
    p = _site_check(tmp_path, no_trace_route=True)
    by_name = {c["name"]: c for c in json.loads(p.stdout)["capabilities"]}
    assert by_name["serving.trace_switch"]["status"] == "not observable"
    assert "HTTP 404" in by_name["serving.trace_switch"]["reason"]


def test_site_check_refuses_a_router_whose_inflight_is_not_a_count_of_routed_requests(tmp_path):
    p = _site_check(tmp_path, inflight="unknown")
    assert p.returncode == 1, p.stdout
    check = json.loads(p.stdout)
    assert check["missing"] == ["router.backend"], check["missing"]
    # the answer's shape is checked where the host answered, as a window checks it: the field and its type named
    assert "$.backend.inflight" in {c["name"]: c for c in check["capabilities"]}["router.backend"]["reason"]


def test_site_check_refuses_a_router_that_lists_the_primary_twice(tmp_path):
    # a stale entry beside the live one: which of the two is the primary's state cannot be told
    p = _site_check(tmp_path, stale_backend=True)
    assert p.returncode == 1, p.stdout
    check = json.loads(p.stdout)
    assert "router.backend" in check["missing"], check["missing"]
    assert "'primary' is listed 2 times" in {c["name"]: c for c in check["capabilities"]}["router.backend"]["reason"]


def test_site_check_calls_a_manager_busy_with_a_load_not_ready_for_a_window(tmp_path):
    p = _site_check(tmp_path, manager_busy_from=1)
    assert p.returncode == 1, p.stdout
    check = json.loads(p.stdout)
    state = {c["name"]: c for c in check["capabilities"]}["manager.state"]
    assert "manager.state" in check["missing"] and "in progress (busy)" in state["reason"], state


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
    p = _site_check(tmp_path, omit_metrics=["flare_requests_active", "flare_requests_pending"])
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
    assert not host_changes(seen)
    assert not (tmp_path / "out" / "log.db").exists()


# --- identity held, restore_path, drain rule (issue 25) ---------------------------------------

DRIFTS = {"tensor_parallel": 1, "draft_tokens": 3, "host_cache_bytes": 16 << 30, "capture_enabled": True,
          "gpu_uuid": "GPU-0dd0000", "gpu_power_limit_w": 250, "trace_enabled": True}


@pytest.mark.parametrize("field", list(DRIFTS))
def test_each_identity_field_drifted_mid_phase_on_a_contract_host_aborts_within_one_request(tmp_path, small_plan, field):
    rc, r, _seen = _window_without_trace(tmp_path, small_plan, cache_entries=4,
                                         drift={"after": 3, "field": field, "value": DRIFTS[field]})
    assert (rc, r["outcome"], r["abort"]["reason"]) == (1, "aborted", "identity_drift"), (r["abort"], r["restoration"])
    prime = next(c for c in r["cells"] if c["phase"] == "A.forward_prime")
    assert prime["status"] == "invalid" and prime["identity_held"] is False
    assert len([q for q in r["requests"] if q["phase"] == "A.forward_prime"]) <= 4  # drifted after 3: caught at 3, or 4
    assert r["verdict"]["hypothesis"] == "inconclusive"
    assert r["restoration"]["verified"]


def test_a_contract_host_whose_hits_never_restore_gives_restore_path(tmp_path, small_plan):
    rc, r, _seen = _window_without_trace(tmp_path, small_plan, cache_entries=4, restore_never_completes=True)
    assert rc == 0 and r["outcome"] == "completed", (r["abort"], r["restoration"])
    assert r["verdict"]["hypothesis"] == "restore_path", r["verdict"]
    rev = next(c for c in r["cells"] if c["phase"] == "A.reverse_replay")
    assert rev["host"]["hits"] > 0 and rev["host"]["fetched_tokens"] == 0


def test_a_contract_host_that_finds_nothing_gives_key_or_checkpoint_eligibility(tmp_path, small_plan):
    rc, r, _seen = _window_without_trace(tmp_path, small_plan, cache_entries=0)
    assert rc == 0 and r["outcome"] == "completed", (r["abort"], r["restoration"])
    assert r["verdict"]["hypothesis"] == "key_or_checkpoint_eligibility", r["verdict"]


def test_site_check_says_the_drain_rule_cannot_be_held_without_the_retiring_gauge(tmp_path):
    host = ContractHost(tmp_path / "host", omit_metrics=["flare_requests_retiring"])
    try:
        p = flare_diag("site", "check", str(host.site), "--plan", str(PLAN), "--json")
        r = flare_diag("run", "--plan", str(PLAN), "--site", str(host.site), "--out", str(tmp_path / "out"))
        seen = host.requests()
    finally:
        host.stop()
    assert p.returncode == 1
    by_name = {c["name"]: c for c in json.loads(p.stdout)["capabilities"]}
    assert by_name["drain.requests_retiring"]["missing"]
    assert "drain rule cannot be held" in by_name["drain.requests_retiring"]["reason"]
    assert r.returncode == 2 and "drain.requests_retiring" in r.stderr and r.stderr.count("\n") == 1
    assert not host_changes(seen)


def test_a_plan_that_accepts_a_weaker_drain_runs_and_every_cell_names_the_unseen_gauge(tmp_path, small_plan):
    host = ContractHost(tmp_path / "host", cache_entries=4, omit_metrics=["flare_requests_retiring"])
    plan = _without_trace(small_plan, tmp_path)
    plan.write_text(plan.read_text() + '\n[drain]\naccept_unobserved = ["requests_retiring"]\n')
    try:
        rc, r = run_window(host, tmp_path / "out", plan)
    finally:
        host.stop()
    assert rc == 0 and r["outcome"] == "completed", (r["abort"], r["restoration"])
    replays = [c for c in r["cells"] if c["status"] == "measured" and c["requests"]]
    assert replays and all(c["drain_unseen"] == ["requests_retiring"] and "requests_retiring" in c["reason"]
                           for c in replays)


def _fixture_with(tmp: Path, name: str, change: dict, body: int | None = 7) -> Path:
    """A copy of the built-in fixture `name` beside a copy of the plan, one body's sampling changed (every
    body's with `body` None; the manifest's hashes updated, so that only the sampling is wrong)."""
    import hashlib
    src = ROOT / "fixtures" / "data" / name
    dst = tmp / name
    dst.mkdir(parents=True)
    bodies = (src / "bodies.jsonl").read_bytes().split(b"\n")
    bodies = [b for b in bodies if b]
    for i in range(len(bodies)) if body is None else [body]:
        bodies[i] = json.dumps({**json.loads(bodies[i]), **change}, separators=(",", ":")).encode()
    (dst / "bodies.jsonl").write_bytes(b"\n".join(bodies) + b"\n")
    m = json.loads((src / "manifest.json").read_text())
    m["sha256"] = [hashlib.sha256(b).hexdigest() for b in bodies]
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


@pytest.mark.parametrize("change", [{"temperature": 0}, {"max_tokens": 64}, {"top_p": 1.0}, {"reasoning_effort": "low"},
                                    {"stream": False}])
def test_a_fixture_with_one_bodys_sampling_changed_is_refused_before_quiesce(tmp_path, churning_host, change):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.read_text())
    _fixture_with(tmp_path, "c1-52", change)
    p = flare_diag("run", "--plan", str(plan), "--site", str(churning_host.site), "--out", str(tmp_path / "out"))
    field = next(iter(change))
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "fixture c1-52: body 7 (sha256" in p.stderr and f"{field} = {change[field]!r}" in p.stderr
    assert not churning_host.requests(), "the host was touched"
    assert not (tmp_path / "out" / "log.db").exists()


def test_a_plan_whose_sampling_is_not_streamed_is_refused_even_with_bodies_that_match_it(tmp_path, churning_host):
    # every body and the plan agree on stream = false, so no sampling check catches it; before, only the offline
    # harness's rehearsal stopped it ("ended aborted; see .../harness/report.md"): its first answer was no stream
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.read_text().replace("[sampling]\n", "[sampling]\nstream = false\n", 1))
    for fixture in ("c1-52", "tok1024"):  # the replay's and the trace arms'
        _fixture_with(tmp_path, fixture, {"stream": False, "stream_options": None}, body=None)
    p = flare_diag("run", "--plan", str(plan), "--site", str(churning_host.site), "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "sampling.stream = false: expected true" in p.stderr, p.stderr
    assert not churning_host.requests(), "the host was touched"
    assert not (tmp_path / "out" / "log.db").exists()


def test_run_piped_into_head_completes_the_window_and_leaves_the_host_restored(tmp_path, small_plan):
    host = ContractHost(tmp_path / "host", cache_entries=4)
    out = tmp_path / "out"
    try:
        p = subprocess.Popen([sys.executable, "-m", "flare_diag.daemon.cli", *with_review(["run", "--plan",
                              str(_without_trace(small_plan, tmp_path)), "--site", str(host.site), "--out", str(out),
                              "--time-scale", SCALE])], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        head = [p.stdout.readline() for _ in range(6)]  # `| head -n 6`: six lines, then the reader is gone
        p.stdout.close()
        err = p.stderr.read()
        rc = p.wait(timeout=300)
        state = json.loads(host.get("manager", "/manager/v1/state"))
        backends = json.loads(host.get("router", "/router/v1/backends"))
    finally:
        host.stop()
    assert len([h for h in head if h]) == 6
    assert rc == 1 and "Traceback" not in err and "the output stream closed during the window" in err, err[-2000:]
    r = json.loads((out / "report.json").read_text())
    assert r["outcome"] == "completed" and r["restoration"]["verified"]
    assert state["loaded"]["recipe"] == "prod-incumbent"
    assert [b["admitted"] for b in backends["backends"]] == [True]


def test_site_check_prints_no_token_a_host_echoes_back_in_its_error_body(tmp_path):
    host = ContractHost(tmp_path / "host", echo_token=True)
    try:
        plain = flare_diag("site", "check", str(host.site), "--plan", str(PLAN))
        as_json = flare_diag("site", "check", str(host.site), "--plan", str(PLAN), "--json")
    finally:
        host.stop()
    for p in (plain, as_json):
        assert p.returncode == 1
        assert "manager" in p.stdout  # the failure is reported ...
        for tok in host.tokens.values():
            assert tok not in p.stdout + p.stderr  # ... without the token it echoed


def test_run_refuses_in_one_line_without_the_token_a_host_echoes_back_in_its_error(tmp_path, small_plan):
    # the refusal's line says why each missing need holds the window back, in the host's words: scrubbed
    host = ContractHost(tmp_path / "host", echo_token=True)
    try:
        p = flare_diag("run", "--plan", str(_without_trace(small_plan, tmp_path)), "--site", str(host.site),
                       "--out", str(tmp_path / "out"), "--time-scale", "60")
    finally:
        host.stop()
    assert p.returncode == 2 and "manager.state: manager state: HTTP 503" in p.stderr, p.stderr
    for tok in host.tokens.values():
        assert tok not in p.stdout + p.stderr
    assert "[token]" in p.stderr


def test_a_contract_host_whose_router_readmits_the_primary_during_the_restore_is_left_to_a_person_who_is_told_it_is_admitted(tmp_path, small_plan):
    # the window aborts (identity drift after three requests); as the restore loads the incumbent the
    # router admits the backend by itself: the last gate before readmit sees it and keeps it out
    rc, r, seen = _window_without_trace(tmp_path, small_plan, cache_entries=4, admit_on_incumbent_load=True,
                                        drift={"after": 3, "field": "tensor_parallel", "value": 1})
    assert (rc, r["outcome"]) == (3, "restore_failed"), (r["abort"], r["restoration"], r["alarms"])
    assert r["restoration"]["readmitted"] is False
    # the router shows it admitted: the alarm says so, never that the primary was left out of rotation
    left = next(a for a in r["alarms"] if a["kind"] == "primary_admitted_unverified")
    assert "containment" in left["detail"] and "before readmit" in left["detail"], left
    assert "backend primary admitted, though the window did not readmit it" in left["detail"], left
    assert "primary_left_quiesced" not in [a["kind"] for a in r["alarms"]]
    assert not [x for x in seen if "/readmit" in x.get("path", "")]


def test_a_contract_host_whose_router_acknowledges_a_readmit_it_does_not_apply_is_not_called_restored(tmp_path, small_plan):
    # the readmit's answer says admitted; the backends read after it say otherwise
    rc, r, seen = _window_without_trace(tmp_path, small_plan, cache_entries=4, readmit_ignored=True)
    assert (rc, r["outcome"]) == (3, "restore_failed"), (r["abort"], r["restoration"], r["alarms"])
    assert r["restoration"]["readmitted"] is False and [x for x in seen if "/readmit" in x.get("path", "")]
    assert any(a["kind"] == "readmit_not_verified" for a in r["alarms"]), r["alarms"]


def test_a_contract_host_behind_a_gateway_that_stamps_every_prompt_aborts_not_as_sent_and_names_no_cause(tmp_path, small_plan):
    # the same exact body counted at another prompt size on the same incarnation: the engine was not given
    # the prompts the window sent, so the replays say nothing of what these bodies reuse
    rc, r, _seen = _window_without_trace(tmp_path, small_plan, cache_entries=4, stamp_prompts=True)
    rev = next(c for c in r["cells"] if c["phase"] == "A.reverse_replay")
    assert rev["status"] == "invalid" and "another prompt size for" in rev["reason"] \
        and "in A.forward_prime #" in rev["reason"], rev
    assert (rc, r["outcome"], r["abort"]["reason"]) == (1, "aborted", "not_as_sent"), (r["outcome"], r["abort"])
    assert r["verdict"]["hypothesis"] == "inconclusive", r["verdict"]
    assert r["restoration"]["verified"], r["restoration"]


def test_reproduce_fit_on_a_contract_hosts_lru_of_records_recovers_its_capacity_and_agrees_on_every_request(churn_window):
    _rc, _r, out, _seen = churn_window
    p = flare_diag("reproduce", str(out / "log.db"), "--fit", "--json")
    fitted = json.loads(p.stdout)
    assert p.returncode == 0, p.stderr
    assert fitted["best"]["family"] == "lru_records" and fitted["best"]["capacity"] == 4
    assert fitted["best"]["agreed"] == fitted["best"]["compared"] > 0
    assert {f["family"] for f in fitted["runners_up"]} == {"seed_pools", "block_lru", "gpu_then_records"}
    assert set(fitted["policies"]) == {"lru", "fifo", "lfu"}


def test_reproduce_fit_recovers_a_host_lru_of_45_records_behind_a_gpu_tier_with_full_agreement(tmp_path):
    host = ContractHost(tmp_path / "host", cache_entries=45, gpu_entries=6)  # the 52 bodies churn the host tier
    try:
        rc, r = run_window(host, tmp_path / "out", _without_trace(PLAN, tmp_path))
    finally:
        host.stop()
    assert rc == 0 and r["outcome"] == "completed", (r["abort"], r["restoration"])
    p = flare_diag("reproduce", str(tmp_path / "out" / "log.db"), "--fit", "--json")
    assert p.returncode == 0, p.stderr
    best = json.loads(p.stdout)["best"]
    assert (best["family"], best["capacity"]) == ("gpu_then_records", 45), best
    assert best["agreed"] == best["compared"] > 0 and not best["lower_bound"]
    assert best["front"] >= 1


def test_init_site_systemd_gives_a_profile_that_site_check_accepts_with_credentials_laid_out_as_the_unit_hands_them(
        tmp_path):
    import os
    host = ContractHost(tmp_path / "host", cache_entries=4)
    try:
        sites, creds = tmp_path / "sites", tmp_path / "credentials"
        p = flare_diag("init-site", "flare", str(sites), "--name", "pool7", "--systemd", "--credentials-dir", str(creds))
        assert p.returncode == 0, p.stderr
        dropin = (sites / "pool7.flare-diagd.conf").read_text()
        loaded = {line.split("=", 1)[1].split(":", 1)[0]: line.split(":", 1)[1]
                  for line in dropin.splitlines() if line.startswith("LoadCredential=")}
        assert set(loaded) == {f"pool7.{s}.token" for s in ("serving", "manager", "router", "monitoring")}
        assert all(Path(path).parent == creds and oct(Path(path).stat().st_mode & 0o777) == "0o600"
                   for path in loaded.values())
        # the operator writes the tokens and the URLs (the GPU view is this host's own service)
        for svc in ("serving", "manager", "router", "monitoring", "gpu"):
            (creds / f"pool7.{svc}.token").write_text(host.tokens[svc] + "\n")
        text = (sites / "pool7.toml").read_text()
        for i, svc in enumerate(("serving", "manager", "router", "monitoring")):
            text = text.replace(f'"http://127.0.0.1:800{i}"', f'"{host.urls[svc]}"')
        text = text.replace("REPLACE-candidate-recipe-name", "glm-candidate").replace(
            'source = "nvml"', f'source = "sim"\nurl = "{host.urls["gpu"]}"\ntoken_file = "credential:pool7.gpu.token"')
        (sites / "pool7.toml").write_text(text)
        # systemd hands each credential over under its id, in a folder of its own: here, that folder
        env = {**os.environ, "CREDENTIALS_DIRECTORY": str(creds)}
        p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "site", "check", str(sites / "pool7.toml"),
                            "--plan", str(PLAN)], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    finally:
        host.stop()
    assert p.returncode == 0 and "NOT READY" not in p.stdout, p.stdout + p.stderr  # exit 0: every need observable


VLLM_OPENAPI = ROOT / "tests" / "data" / "metrics" / "vllm-0.32.0" / "openapi.json"  # recorded from vLLM 0.32.0


def test_a_body_the_engines_request_schema_refuses_is_refused_before_quiesce_naming_the_body_and_field(tmp_path):
    host = ContractHost(tmp_path / "host", openapi=str(VLLM_OPENAPI))
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.read_text())
    _fixture_with(tmp_path, "c1-52", {"top_k": "many"})  # vLLM's schema: top_k is an integer
    try:
        p = flare_diag("run", "--plan", str(plan), "--site", str(host.site), "--out", str(tmp_path / "out"))
        seen = host.requests()
    finally:
        host.stop()
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "serving.request_schema" in p.stderr and "fixture c1-52: body 7 (sha256" in p.stderr and ": top_k: 'many'" in p.stderr
    assert not host_changes(seen)
    assert not (tmp_path / "out" / "log.db").exists()


def test_site_check_finds_every_body_of_the_seeds_fixtures_inside_a_real_vllms_request_schema(tmp_path):
    p = _site_check(tmp_path, openapi=str(VLLM_OPENAPI))
    by_name = {c["name"]: c for c in json.loads(p.stdout)["capabilities"]}
    assert by_name["serving.request_schema"]["status"] == "observable"
    assert by_name["serving.request_schema"]["reason"] == "the engine's schema accepts all 60 bodies"  # c1-52 and tok1024


def test_a_host_whose_identity_is_json_nested_too_deep_is_malformed_not_an_internal_error(tmp_path):
    p = _site_check(tmp_path, deep_identity=200_000)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "the answer's JSON is nested too deep to read" in p.stdout
    assert "internal error" not in p.stdout


def test_a_router_whose_inflight_counts_the_engines_own_requests_aborts_containment_and_says_it_may_be_that(
        tmp_path, small_plan):
    rc, r, _seen = _window_without_trace(tmp_path, small_plan, naive_inflight=True, token_delay_s=0.3)
    assert r["abort"]["reason"] == "containment", r["abort"]
    assert "a router whose inflight counts the engine's running requests" in r["abort"]["detail"]
    # the restore's own direct preflight reads as traffic too when a router poll lands during it: then the
    # primary is kept out (exit 3), as for any traffic it cannot tell from a leak; else it is readmitted
    assert (rc, r["restoration"]["verified"]) in ((1, True), (3, False)), (rc, r["restoration"], r["alarms"])


def test_a_window_against_a_host_reached_over_https_times_every_first_token_by_the_kernels_stamp(tmp_path, small_plan):
    """Every service of the contract-only host behind TLS (a certificate openssl makes for the test, which the
    daemon is told to trust): the window runs as over http, and its generations' first tokens carry the
    kernel's receive stamps of their ciphertext, not the loop's read times (daemon/hosts/rxstamps.py)."""
    import os

    from flare_diag.daemon.hosts import rxstamps
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    host = ContractHost(tmp_path / "host", cache_entries=4, tls={"cert": str(cert), "key": str(key)})
    out = tmp_path / "out"
    try:
        assert all(u.startswith("https://") for u in host.urls.values())
        p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli",
                            *with_review(["run", "--plan", str(_without_trace(small_plan, tmp_path)), "--site",
                                          str(host.site), "--out", str(out), "--time-scale", SCALE])],
                           cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "SSL_CERT_FILE": str(cert)})
    finally:
        host.stop()
    assert (out / "report.json").exists(), p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "report.json").read_text())
    assert (p.returncode, r["outcome"]) == (0, "completed"), (r["abort"], r["cells"])
    with LogReader(out / "log.db") as reader:
        stamps = [e.event().first_token_stamp for e in reader.iter(types=["request_done"])
                  if e.event().outcome == "ok" and e.event().phase != "preflight"]
    assert stamps and set(stamps) == {"kernel" if rxstamps.supported() else "read"}


def test_a_contract_host_whose_cache_outlives_the_engine_measures_nothing_on_an_incarnation_it_was_not_empty_for(
        tmp_path, small_plan):
    """An external KV store keeps A's entries when B loads, and B's gauges say its cache is empty: B's cold prime
    finds them at its first request, so nothing on B is measured and no cause is named."""
    rc, r, _seen = _window_without_trace(tmp_path, small_plan, cache_entries=500, external_cache=True)
    cells = {c["phase"]: c for c in r["cells"]}
    assert cells["A.forward_prime"]["status"] == "measured" and cells["A.reverse_replay"]["status"] == "measured"
    assert cells["B.forward_prime"]["status"] == "invalid", cells["B.forward_prime"]
    assert "verified fresh, was not empty: its first request found" in cells["B.forward_prime"]["reason"]
    assert cells["B.forward_replay"]["status"] == "invalid"
    assert r["verdict"]["hypothesis"] == "inconclusive", r["verdict"]
    assert r["verdict"]["next_experiment"].startswith("Run the B arm again on an incarnation that starts cold")
    assert r["restoration"]["verified"] and rc in (0, 1)


def _serve_the_bodies_as_traffic(host: ContractHost, fixture: str) -> None:
    """The incumbent answers the fixture's bodies before the window, as the production traffic they came from."""
    import urllib.request
    for body in (ROOT / "fixtures" / "data" / fixture / "bodies.jsonl").read_bytes().splitlines():
        req = urllib.request.Request(host.urls["serving"] + "/v1/chat/completions", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {host.tokens['serving']}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()


def test_a_store_warm_with_the_bodies_before_the_window_keeps_the_b_arm_unloaded_and_the_primary_out_no_longer(
        tmp_path, small_plan):
    """The incumbent's traffic left the bodies in a store outside the engine: A's first request finds them, so no
    verdict can come, and B would load on the same store: the window restores without loading B."""
    host = ContractHost(tmp_path / "host", cache_entries=500, external_cache=True)
    try:
        _serve_the_bodies_as_traffic(host, "tok1024")
        rc, r = run_window(host, tmp_path / "out", _without_trace(small_plan, tmp_path))
        loads = [x for x in host.requests() if x.get("path") == "/manager/v1/load"]
    finally:
        host.stop()
    cells = {c["phase"]: c for c in r["cells"]}
    assert cells["A.forward_prime"]["status"] == "invalid" and cells["A.reverse_replay"]["not_fresh"], cells
    assert cells["B.forward_replay"]["status"] == "deferred"
    assert len(loads) == 2  # A, then the incumbent back: no B
    assert r["verdict"]["next_experiment"].startswith("Repeat the window, each arm on an incarnation that starts cold")
    assert (rc, r["outcome"], r["restoration"]["verified"]) == (1, "partial", True)


def _for_sglang(plan: Path, folder: Path) -> Path:
    """The plan without its trace arms, its drains judged without the gauges SGLang does not export."""
    out = folder / "sglang.toml"
    out.write_text(_without_trace(plan, folder).read_text() + '\n[drain]\naccept_unobserved = ["requests_retiring", '
                   '"host_transfers_inflight", "host_transfers_waiting"]\n')
    return out


def test_an_sglang_host_whose_incarnations_count_their_own_warm_up_verifies_them_fresh_and_says_so(tmp_path, small_plan):
    """SGLang counts the generation it sends itself as it starts: each fresh incarnation's counters show one request.
    Held to counters at zero, no SGLang window would ever measure a cell."""
    host = ContractHost(tmp_path / "host", cache_entries=500, sglang=True)
    try:
        rc, r = run_window(host, tmp_path / "out", _for_sglang(small_plan, tmp_path))
    finally:
        host.stop()
    cells = {c["phase"]: c for c in r["cells"]}
    for arm in ("A", "B"):
        assert cells[f"{arm}.identity"]["status"] == "measured", cells[f"{arm}.identity"]
        assert ("counters reset (but for 1 start-up request of the engine's own: 7 prompt, 8 generated tokens) and empty "
                "host cache verified") in cells[f"{arm}.identity"]["reason"]
    assert set(required_cells(r).values()) == {"measured"}, required_cells(r)
    assert (rc, r["outcome"], r["restoration"]["verified"]) == (0, "completed", True), (r["abort"], r["alarms"])
