"""The seed's last rows: a production plan runs only after someone else reviewed its exact bytes, its
preserved history is checked, and the offline harness is validated on it first (through `run`, on the
contract host)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from flare_diag.events.reader import LogReader
from tests.contract_tools import BUILD, ROOT, ContractHost, host_changes
from tests.daemontools import Daemon, Sim
from tests.reviewtools import REVIEWER
from tests.test_contract_host import _without_trace



def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def sign(plan: Path, by: str, log: Path, *more: str) -> None:
    p = cli("review", "sign", str(plan), "--by", by, "--log", str(log), *more)
    assert p.returncode == 0, p.stderr


def run(host: ContractHost, plan: Path, out: Path, *more: str) -> subprocess.CompletedProcess:
    return cli("run", "--plan", str(plan), "--site", str(host.site), "--out", str(out), "--time-scale", "60", *more)


def untouched(host: ContractHost) -> bool:
    return not host_changes(host.requests())


def test_a_production_plan_without_a_review_log_is_refused_and_the_host_untouched(tmp_path, small_plan):
    host = ContractHost(tmp_path / "host")
    try:
        p = run(host, _without_trace(small_plan, tmp_path), tmp_path / "out")
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "needs a recorded review" in p.stderr, p.stderr
        assert untouched(host) and not (tmp_path / "out" / "log.db").exists()
    finally:
        host.stop()


def refused_untouched(tmp_path: Path, plan: Path, words: str) -> None:
    """`run` with the review log refuses the plan (exit 2, `words`), and the host saw no change."""
    host = ContractHost(tmp_path / "host")
    try:
        p = run(host, plan, tmp_path / "out", "--reviews", str(tmp_path / "reviews.db"))
        assert p.returncode == 2 and words in p.stderr, p.stderr
        assert untouched(host)
    finally:
        host.stop()


def test_a_review_of_other_bytes_does_not_count(tmp_path, small_plan):
    plan = _without_trace(small_plan, tmp_path)
    sign(plan, "bob", tmp_path / "reviews.db")
    plan.write_text(plan.read_text() + "\n# one more line, after the review\n")
    refused_untouched(tmp_path, plan, "no review of these exact bytes")


def test_a_review_by_the_plans_author_is_refused(tmp_path, small_plan):
    plan = _without_trace(small_plan, tmp_path)
    sign(plan, "Lead-Research", tmp_path / "reviews.db")  # the author, whatever the case
    refused_untouched(tmp_path, plan, "only reviews of these bytes are by the plan's author")


def test_a_review_by_someone_else_lets_it_run_and_the_report_names_the_reviewer(tmp_path, small_plan):
    plan = _without_trace(small_plan, tmp_path)
    sign(plan, "Bob Reviewer", tmp_path / "reviews.db", "--note", "bodies and sampling checked", "--export")
    assert json.loads(Path(f"{plan}.review-Bob-Reviewer.json").read_text())["seq"] == 1
    host = ContractHost(tmp_path / "host", cache_entries=4)
    try:
        p = run(host, plan, tmp_path / "out", "--reviews", str(tmp_path / "reviews.db"))
    finally:
        host.stop()
    r = json.loads((tmp_path / "out" / "report.json").read_text())
    assert p.returncode == 0 and r["outcome"] == "completed", p.stderr[-1500:]
    assert r["review"]["by"] == "Bob Reviewer" and r["review"]["seq"] == 1
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Plan reviewed by **Bob Reviewer** (bodies and sampling checked)" in md


def test_the_harness_rehearsal_is_in_the_windows_log_and_report_with_its_logs_head(tmp_path, small_plan):
    plan = _without_trace(small_plan, tmp_path)
    sign(plan, "bob", tmp_path / "reviews.db")
    host = ContractHost(tmp_path / "host", cache_entries=4)
    try:
        p = run(host, plan, tmp_path / "out", "--reviews", str(tmp_path / "reviews.db"))
    finally:
        host.stop()
    assert p.returncode == 0, p.stderr[-1500:]
    with LogReader(tmp_path / "out" / "log.db") as reader:
        events = [e.event() for e in reader.iter()]
    names = [type(e).__name__ for e in events]
    assert names.index("HarnessRehearsed") < names.index("WindowOpened")  # a precondition, before anything
    ev = events[names.index("HarnessRehearsed")]
    harness_log = Path(ev.folder) / "log.db"  # this run's, or the earlier one that validated the same bytes
    v = cli("log", "verify", str(harness_log))
    assert v.returncode == 0 and f"head seq {ev.log_head_seq} hash {ev.log_head_hash}" in v.stdout, v.stdout
    r = json.loads((tmp_path / "out" / "report.json").read_text())
    assert r["harness"]["log_head_hash"] == ev.log_head_hash and r["harness"]["outcome"] == "completed"
    assert f"hash {ev.log_head_hash[:16]}" in (tmp_path / "out" / "report.md").read_text()


def test_a_plan_the_harness_cannot_complete_is_refused_before_the_host_is_touched(tmp_path, small_plan):
    # a build the simulator does not serve: the harness's rehearsal aborts on its identity
    plan = _without_trace(small_plan, tmp_path)
    plan.write_text(plan.read_text().replace("draft_tokens = 2", "draft_tokens = 3"))
    sign(plan, "bob", tmp_path / "reviews.db")
    host = ContractHost(tmp_path / "host", build={**BUILD, "draft_tokens": 3})
    try:
        p = run(host, plan, tmp_path / "out", "--reviews", str(tmp_path / "reviews.db"))
        assert p.returncode == 2 and "the offline harness could not complete this plan" in p.stderr, p.stderr
        assert untouched(host)
    finally:
        host.stop()


def test_a_preserved_file_changed_during_the_window_is_said_by_the_report_and_log_verify(tmp_path, small_plan):
    history = tmp_path / "wave-v1"
    history.mkdir()
    (history / "report.md").write_text("the hosted historical report\n")
    plan = _without_trace(small_plan, tmp_path)
    plan.write_text(plan.read_text() + '\n[preserve]\npaths = ["wave-v1"]\n')
    sign(plan, "bob", tmp_path / "reviews.db")
    host = ContractHost(tmp_path / "host", cache_entries=4, load_delay_s=1.0)
    out = tmp_path / "out"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "flare_diag.daemon.cli", "run", "--plan", str(plan), "--site",
                                 str(host.site), "--out", str(out), "--time-scale", "60", "--reviews",
                                 str(tmp_path / "reviews.db"), "--json"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        for line in proc.stdout:  # once a phase runs, someone rewrites the preserved report
            if '"phase_started"' in line:
                (history / "report.md").write_text("overwritten during the window\n")
                break
        proc.communicate(timeout=300)
    finally:
        host.stop()
    r = json.loads((out / "report.json").read_text())
    (row,) = r["preserved"]
    assert row["path"] == str(history.resolve()) and row["unchanged"] is False and row["sha256_before"] != row["sha256_after"]
    md = (out / "report.md").read_text()
    assert "PRESERVED HISTORY CHANGED" in md[:md.index("## Verdict")] and "**CHANGED**" in md
    v = cli("log", "verify", str(out / "log.db"))
    assert v.returncode == 1 and f"PRESERVED HISTORY CHANGED: {history.resolve()}" in v.stdout, v.stdout


def test_reports_inside_a_preserved_folder_are_refused(tmp_path, small_plan):
    plan = _without_trace(small_plan, tmp_path)
    plan.write_text(plan.read_text() + '\n[preserve]\npaths = ["history"]\n')
    (tmp_path / "history").mkdir()
    sign(plan, "bob", tmp_path / "reviews.db")
    host = ContractHost(tmp_path / "host")
    try:
        p = run(host, plan, tmp_path / "history" / "out", "--reviews", str(tmp_path / "reviews.db"))
        assert p.returncode == 2 and "would be written inside it" in p.stderr, p.stderr
        assert untouched(host)
    finally:
        host.stop()


def test_the_daemon_starts_a_production_plan_only_with_a_review_in_its_own_log(tmp_path, small_plan):
    sim = Sim(tmp_path)
    d = Daemon(tmp_path).start()
    try:
        start = [sys.executable, "-m", "flare_diag.daemon.cli", "start", str(small_plan), "--site", sim.site.stem,
                 "--time-scale", "100", "--accept-partial", "--socket", str(d.socket)]
        p = subprocess.run(start, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and "the daemon's log" in p.stderr and "review" in p.stderr, p.stderr
        listed = cli("review", "list", str(small_plan), "--socket", str(d.socket))
        assert "may run: no" in listed.stdout, listed.stdout
        d.review(small_plan)
        listed = cli("review", "list", str(small_plan), "--socket", str(d.socket), "--json")
        assert json.loads(listed.stdout)["may_run"] and json.loads(listed.stdout)["reviews"][0]["by"] == REVIEWER
        p = subprocess.run(start, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
    finally:
        d.stop()
        sim.stop()


def test_the_same_bytes_validated_once_are_not_rehearsed_again_and_the_window_names_that_rehearsal(tmp_path, small_plan):
    plan = _without_trace(small_plan, tmp_path)
    sign(plan, "bob", tmp_path / "reviews.db")
    host = ContractHost(tmp_path / "host", cache_entries=4)
    cache = {"FLARE_DIAG_HARNESS_CACHE": str(tmp_path / "cache")}
    try:
        runs = [subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "run", "--plan", str(plan), "--site",
                                str(host.site), "--out", str(tmp_path / f"out{i}"), "--time-scale", "60", "--reviews",
                                str(tmp_path / "reviews.db")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                               env={**__import__("os").environ, **cache}) for i in (1, 2)]
    finally:
        host.stop()
    assert [p.returncode for p in runs] == [0, 0], runs[1].stderr[-800:]
    first, second = (json.loads((tmp_path / f"out{i}" / "report.json").read_text())["harness"] for i in (1, 2))
    assert first == second and first["folder"] == str((tmp_path / "out1" / "harness").resolve())
    assert not (tmp_path / "out2" / "harness").exists()  # no second rehearsal of the same bytes


def test_with_an_earlier_window_the_harness_also_rehearses_the_model_fitted_to_it(tmp_path, small_plan, default_rehearsal):
    """The earlier window (the shipped plan's default rehearsal: the seed's pools at 52 rows, every request
    agreeing) is fitted by the reproducer, and the plan rehearsed against that model before anything changes."""
    _rc, _report, earlier = default_rehearsal
    plan = _without_trace(small_plan, tmp_path)
    sign(plan, "bob", tmp_path / "reviews.db")
    host = ContractHost(tmp_path / "host", cache_entries=4)
    try:
        p = run(host, plan, tmp_path / "out", "--reviews", str(tmp_path / "reviews.db"),
                "--calibrate", str(earlier / "log.db"))
    finally:
        host.stop()
    assert p.returncode == 0, p.stderr[-1500:]
    r = json.loads((tmp_path / "out" / "report.json").read_text())
    f = r["harness_fitted"]
    assert f["scenario"].startswith("fitted to window ") and "seed_pools of 52 (288 of 288 requests agree)" in f["scenario"]
    assert f["outcome"] == "completed" and Path(f["folder"], "log.db").is_file()
    assert "Offline harness against the reproducer's model fitted to window" in (tmp_path / "out" / "report.md").read_text()


def test_a_fitted_model_the_simulator_cannot_serve_is_said_and_refuses_nothing(tmp_path, small_plan):
    """A contract host's cache is a plain LRU of records: the fit finds it, and the simulator has no such
    cache, so that rehearsal is `not_applicable`, named in the report, and the window runs."""
    plan = _without_trace(small_plan, tmp_path)
    sign(plan, "bob", tmp_path / "reviews.db")
    host = ContractHost(tmp_path / "host", cache_entries=4)
    try:
        first = run(host, plan, tmp_path / "first", "--reviews", str(tmp_path / "reviews.db"))
        second = run(host, plan, tmp_path / "second", "--reviews", str(tmp_path / "reviews.db"),
                     "--calibrate", str(tmp_path / "first" / "log.db"))
    finally:
        host.stop()
    assert (first.returncode, second.returncode) == (0, 0), second.stderr[-1500:]
    f = json.loads((tmp_path / "second" / "report.json").read_text())["harness_fitted"]
    assert "lru_records of 4" in f["scenario"] and f["outcome"] == "not_applicable"


def test_the_daemon_fits_the_sites_earlier_window_from_its_own_log_before_the_next(tmp_path, small_plan):
    from tests.daemontools import in_phase
    sim = Sim(tmp_path)
    d = Daemon(tmp_path).start()
    try:
        ids = []
        for _ in range(2):
            p = d.cli("start", str(small_plan), "--site", sim.site.stem, "--time-scale", "100", "--accept-partial")
            assert p.returncode == 0, p.stderr
            ids.append(p.stdout.strip().splitlines()[-1])
            d.wait_for(lambda st: in_phase(st, 1), timeout=120, what="a phase with requests")
            assert d.cli("abort", "--reason", "next window").returncode == 0
            d.wait_for(lambda st: st["state"] == "idle" and st["last_window"], timeout=120, what="the restore")
    finally:
        d.stop()
        sim.stop()
    with LogReader(d.state / "log.db") as reader:
        fits = [e.event() for e in reader.iter(types=["harness_rehearsed"]) if e.window_id == ids[1]]
    assert [f.scenario.startswith(f"fitted to window {ids[0]}") for f in fits] == [False, True], [f.scenario for f in fits]
