"""Reports: pure projections of the log, byte-identical on regeneration, distinct by status, never overwritten."""

from __future__ import annotations

import asyncio
from pathlib import Path

import html
import json
import re
import stat

import msgspec
import pytest

from flare_diag.daemon.cli.commands import main
from flare_diag.daemon.reports.publish import FORMATS, build_report, publish_snapshot, render, write_report_files
from flare_diag.daemon.reports.report_html import CHARTS, render_html
from flare_diag.daemon.reports.report_md import render_md
from flare_diag.events.report_schema import validate
from tests.logtools import write_window


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    """One whole window's log, read (never changed) by the tests below."""
    db = tmp_path_factory.mktemp("report-log") / "log.db"
    asyncio.run(write_window(db))
    return db


def _aborting_hook(world, history):
    from flare_diag.events.schema import OperatorAbort
    sent = sum(1 for _i, ds in history for d in ds if type(d).__name__ == "RequestMeasured")
    if sent == 5 and not any(type(i).__name__ == "OperatorAbort" for i, _ds in history):
        return OperatorAbort(at_ns=world.now, reason="test")
    return None


def test_regenerating_a_report_from_the_same_log_gives_identical_bytes(log):
    first = {f: render(build_report(log, "w-report"), f) for f in FORMATS}
    second = {f: render(build_report(log, "w-report"), f) for f in FORMATS}
    assert first == second and all(len(b) > 1000 for b in first.values())


def test_report_json_of_a_completed_window_validates_against_the_contract_schema(log):
    rep = validate(render(build_report(log, "w-report"), "json"))
    assert rep.outcome == "completed" and rep.verdict is not None and rep.restoration.verified
    assert {c.phase for c in rep.cells} >= {"A.identity", "A.forward_prime", "A.reverse_replay", "B.small_control"}


async def test_report_json_of_an_aborted_window_validates_against_the_contract_schema(tmp_path):
    await write_window(tmp_path / "a.db", hook=_aborting_hook)
    rep = validate(render(build_report(tmp_path / "a.db", "w-report"), "json"))
    assert rep.outcome == "aborted" and rep.abort.reason == "operator"


def test_schema_rejects_a_report_missing_a_contract_field(log):
    data = json.loads(render(build_report(log, "w-report"), "json"))
    del data["restoration"]["verified"]
    with pytest.raises(msgspec.ValidationError, match="verified"):
        validate(json.dumps(data).encode())


def _four_status_report(log) -> dict:
    r = build_report(log, "w-report")
    base = r["cells"][1]
    r["cells"] = [{**base, "phase": f"P.{s}", "status": s, "reason": f"because {s}"}
                  for s in ("measured", "failed", "invalid", "deferred")]
    return r


def test_each_cell_status_renders_distinctly_in_html(log):
    html = render_html(_four_status_report(log))
    rows = re.findall(r'<tr class="(st-[a-z]+)"><td>P\.([a-z]+)</td>', html)
    assert rows == [(f"st-{s}", s) for s in ("measured", "failed", "invalid", "deferred")]
    styles = {s: re.search(rf"\.st-{s}{{([^}}]*)}}", html).group(1) for s in ("measured", "failed", "invalid", "deferred")}
    assert len(set(styles.values())) == 4  # four different looks, not one look with four names


def test_each_cell_status_renders_distinctly_in_md(log):
    md = render_md(_four_status_report(log))
    marks = [re.search(rf"\| P\.{s} \| ([^|]+) \|", md).group(1).strip() for s in ("measured", "failed", "invalid", "deferred")]
    assert len(set(marks)) == 4


def test_the_small_control_is_marked_not_comparable(log):
    r = build_report(log, "w-report")
    assert [c["comparable"] for c in r["cells"] if c["phase"] == "B.small_control"] == [False]
    assert "| B.small_control |" in render_md(r) and "not comparable" in render_md(r).split("| B.small_control |")[1].split("\n")[0]


def test_unobservable_counters_show_as_not_applicable_never_as_zero(log):
    r = build_report(log, "w-report")
    r["cells"][1]["host"] = {"lookups": None, "hits": None, "fetched_tokens": None, "reused_tokens": 7}
    line = next(x for x in render_md(r).splitlines() if x.startswith(f"| {r['cells'][1]['phase']} |"))
    # hits and lookups both unobservable: one n/a for the pair; reused 7 beside an unobservable fetched
    assert "| n/a |" in line and "| 7 / n/a |" in line


def test_every_request_is_a_row_of_the_md_and_html_request_tables_under_its_phase(log):
    r = build_report(log, "w-report")
    assert len(r["requests"]) > 10
    md_rows = [x for x in render_md(r).split("### Requests")[1].splitlines() if x.startswith("| ") and "sha256" not in x]
    assert [x.split(" | ")[2] for x in md_rows] == [q["body_sha256"][:12] for q in r["requests"]]
    html = render_html(r).split("<h3>Requests</h3>")[1]
    tables = re.findall(r"<summary>([^:<]+): (\d+) requests</summary>.*?<tbody>(.*?)</tbody>", html, re.S)
    got = [(phase, cells[2]) for phase, _n, body in tables
           for cells in (re.findall(r"<td>([^<]*)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", body))]
    assert got == sorted(((q["phase"], q["body_sha256"][:12]) for q in r["requests"]),
                         key=lambda x: [p for p, _n, _b in tables].index(x[0]))
    assert all(int(n) == sum(q["phase"] == phase for q in r["requests"]) for phase, n, _b in tables)


def test_report_files_written_in_pieces_hold_the_bytes_of_the_whole_rendering(log, tmp_path):
    r = build_report(log, "w-report")
    write_report_files(r, tmp_path)
    assert all((tmp_path / f"report.{f}").read_bytes() == render(r, f) for f in FORMATS)
    assert render(r, "md") == render_md(r).encode() and render(r, "html") == render_html(r).encode()
    assert render(r, "json") == msgspec.json.encode(r) + b"\n"


def test_a_restore_that_did_not_verify_is_flagged_above_the_verdict_in_md_and_html(log):
    r = build_report(log, "w-report")
    r["outcome"] = "restore_failed"
    r["restoration"] = {**r["restoration"], "verified": False, "incumbent_sha256_match": False, "readmitted": False}
    r["alarms"] = [{"kind": "primary_left_quiesced", "detail": "not readmitted to the router: incumbent_sha256_match failed"}]
    for text in (render_md(r), render_html(r)):
        top = text[:text.index("Verdict")]
        assert "Needs attention" in top and "primary_left_quiesced" in top
        assert "restoration NOT verified: incumbent_sha256_match, readmitted failed" in top


def test_a_verified_restore_without_alarms_needs_no_attention(log):
    r = build_report(log, "w-report")
    assert r["restoration"]["verified"] and not r["alarms"]
    assert "Needs attention" not in render_md(r) and "Needs attention" not in render_html(r)


def test_html_is_self_contained(log):
    html = render_html(build_report(log, "w-report"))
    assert "<script" not in html and "<link" not in html and "@import" not in html
    assert not re.search(r"""(src|href)\s*=""", html)
    assert not [u for u in re.findall(r"url\(([^)]*)\)", html) if not u.startswith("#")]
    assert html.count("<svg") == len(CHARTS)


def _before_any_request_row(text: str, needle: str, first_row: str) -> None:
    assert needle in text and first_row in text
    assert text.index(needle) < text.index(first_row), needle


def test_the_restoration_line_and_the_verdict_come_before_any_per_request_row_in_md(log):
    r = build_report(log, "w-report")
    md = render_md(r)
    first_row = f"| {r['requests'][0]['phase']} | 0 | {r['requests'][0]['body_sha256'][:12]} |"
    for needle in ("Restoration: verified", "## Verdict", f"(`{r['verdict']['hypothesis']}`)", "Next step:"):
        _before_any_request_row(md, needle, first_row)


def test_the_restoration_line_and_the_verdict_come_before_any_per_request_row_in_html(log):
    r = build_report(log, "w-report")
    html = render_html(r)
    for needle in ("id=restoration-line", "Restoration: verified", "id=verdict", r["verdict"]["hypothesis"], "Next step:"):
        _before_any_request_row(html, needle, "<table class=requests>")


def test_the_restoration_says_its_minutes_to_a_tenth_as_the_cells_do(log):
    r = build_report(log, "w-report")
    r["restoration"] = {**r["restoration"], "started_minute": 67.2117, "finished_minute": 68.0861}
    md = render_md(r)
    assert "minutes 67.2 to 68.1" in md.split("## ")[0] and "- minutes 67.2 to 68.1; verified" in md
    assert "67.2117" not in md


def test_the_drain_table_gives_minutes_to_a_hundredth(log):
    from flare_diag.daemon.reports.report_view import drain_rows
    r = build_report(log, "w-report")
    r["drains"] = [{"purpose": "quiesce", "settled": True, "waited_s": 0.5, "polls": 2, "minute": 0.0083}]
    assert drain_rows(r) == [["quiesce", "yes", "0.5", "2", "0.01"]]


def test_every_chart_has_ticks_on_its_value_axes_and_axis_titles_that_name_their_units(default_rehearsal):
    html = (default_rehearsal[2] / "report.html").read_text()
    for cid, *_ in CHARTS:
        svg = re.search(rf'<figure id="{cid}" class=chart>(.*?)</figure>', html, re.S).group(1)
        ticks = re.findall(r'class="tick-[xy]"[^>]*>([^<]+)<', svg)
        titles = re.findall(r'class="axis-[xy]"[^>]*>([^<]+)<', svg)
        assert len(ticks) >= 2 and titles, cid
        assert all(re.search(r"\((tokens|min|s|events|window s|% of capacity|request index)\)", t) or "window s" in t
                   for t in titles), (cid, titles)
        assert all(re.fullmatch(r"-?[\d.]+[kM%]?", t) for t in ticks), (cid, ticks)


def test_repeated_findings_are_merged_into_one_line_naming_each_phase():
    from flare_diag.daemon.reports.report_view import merged_findings
    got = merged_findings(["A.x: 8 host hits without a completed restore", "B.y: 52 lookups found nothing",
                           "C.z: 8 host hits without a completed restore", "a sentence: with a colon"])
    assert got == ["8 host hits without a completed restore — 2 phases: A.x, C.z", "B.y: 52 lookups found nothing",
                   "a sentence: with a colon"]


def test_natural_failures_are_counted_per_phase_and_kind_before_the_request_rows(log):
    r = build_report(log, "w-report")
    r["natural_failures"] = [{"phase": "A.p", "order_index": i, "body_index": i, "kind": k}
                             for i, k in enumerate(["length", "length", "reasoning_only"])]
    md = render_md(r)
    assert "| A.p | 3 | length 2, reasoning_only 1 |" in md
    assert md.index("| A.p | 3 |") < md.index("### Requests")
    assert "every natural failure (3)" in render_html(r)


def test_gpu_count_and_power_are_read_from_the_identity_the_window_saw(default_rehearsal):
    _rc, r, _out = default_rehearsal
    before = r["identity"]["observed"][0]
    assert before["identity"]["gpu_count"] == r["identity"]["expected"]["gpu_count"]
    assert before["identity"]["gpu_power_limit_w"] == r["identity"]["expected"]["gpu_power_limit_w"]
    assert "gpu_count" not in before["mismatches"]


def test_the_report_keeps_the_host_cache_occupancy_and_churn_of_each_replay_phase(default_rehearsal):
    _rc, r, _out = default_rehearsal
    occ = {o["phase"]: o for o in r["occupancy"]}
    a = occ["A.reverse_replay"]
    assert 0 < a["rows_used_peak"] <= a["rows_capacity"] and 0 < a["pages_used_peak"] <= a["pages_capacity"]
    assert set(a["stores"]) == {"message_prefix", "full_prompt", "terminal"} and a["evictions"]["row"] > 0
    assert a["compactions"] is not None
    md = (_out / "report.md").read_text()
    assert f"{a['rows_used_peak']} / {a['rows_capacity']}" in md


def test_the_report_keeps_the_router_monitoring_gpu_and_configuration_snapshots(default_rehearsal):
    _rc, r, out = default_rehearsal
    assert set(r["snapshots"]["before"]) == {"router", "monitoring", "gpu", "configuration"}
    assert {"router", "gpu", "monitoring"} <= set(r["snapshots"]["after"])
    md = (out / "report.md").read_text()
    assert "2 GPU(s), power limit 300 W" in md and "registered yes" in md


def test_a_snapshot_is_never_overwritten_and_earlier_ones_stay_as_they_were(log, tmp_path):
    root = tmp_path / "reports"
    r = build_report(log, "w-report")
    first = publish_snapshot(r, root, now_s=0)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in first.iterdir()}
    (root / "w-report" / "1970-01-01-2").mkdir()  # a publisher racing us took the next number
    second = publish_snapshot(r, root, now_s=0)
    assert first.name == "1970-01-01-1" and second.name == "1970-01-01-3"
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in first.iterdir()} == before
    assert all(not (p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) for p in first.iterdir())
    assert sorted(p.name for p in first.iterdir()) == ["report.html", "report.json", "report.md"]


def test_offline_report_command_prints_the_chosen_format(log, capsysbinary):
    assert main(["report", str(log), "--format", "json"]) == 0
    assert json.loads(capsysbinary.readouterr().out)["window_id"] == "w-report"


def test_offline_report_with_an_unknown_window_exits_2_naming_it(log, capsys):
    assert main(["report", str(log), "--window", "nope"]) == 2
    assert "--window nope" in capsys.readouterr().err


@pytest.fixture(scope="module")
def repeats_log(tmp_path_factory) -> Path:
    """Three windows of a candidate and three of a baseline in one log (the same World: no benefit)."""
    db = tmp_path_factory.mktemp("repeats") / "log.db"

    async def write() -> None:
        for w in ("c1", "c2", "c3", "b1", "b2", "b3"):
            await write_window(db, window_id=w)
    asyncio.run(write())
    return db


def test_report_compare_needs_three_matched_repeats_and_says_why(repeats_log, capsys):
    assert main(["report", "compare", str(repeats_log), "--windows", "c1", "c2", "--baseline", "b1"]) == 1
    assert "need 3 matched" in capsys.readouterr().out


def test_report_compare_rejects_a_candidate_without_the_primary_benefit_and_says_so_in_json(repeats_log, capsys):
    assert main(["report", "compare", str(repeats_log), "--windows", "c1", "c2", "c3", "--baseline", "b1", "b2", "b3",
                 "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["accepted"] is False and "primary benefit 0.0% is below 5%" in out["reason"]
    assert set(out["runs"]) == {"c1", "c2", "c3", "b1", "b2", "b3"} and out["runs"]["b1"]["role"] == "baseline"


def _follow_on_plan(**bar) -> dict:
    """The shipped plan as a follow-on's windows run it, with `bar` in its [follow_on] table."""
    from tests.policy_world import plan_builtins
    plan = plan_builtins()
    plan["follow_on"] = {"stage": "policy", "source_window": "w0", "source_plan_sha256": "x",
                         "verdict": "row_checkpoint_churn", **bar}
    return plan


@pytest.fixture(scope="module")
def strict_repeats_log(tmp_path_factory) -> Path:
    """Six windows of a follow-on plan asking at least 10% benefit; then one whose plan asks the seed's 5%."""
    db = tmp_path_factory.mktemp("strict") / "log.db"

    async def write() -> None:
        for w in ("c1", "c2", "c3", "b1", "b2", "b3"):
            await write_window(db, window_id=w, plan=_follow_on_plan(min_benefit=0.1))
        await write_window(db, window_id="s1", plan=_follow_on_plan())
    asyncio.run(write())
    return db


def test_report_compare_holds_the_stricter_bar_the_follow_on_plan_sets(strict_repeats_log, capsys):
    assert main(["report", "compare", str(strict_repeats_log), "--windows", "c1", "c2", "c3",
                 "--baseline", "b1", "b2", "b3", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert "primary benefit 0.0% is below 10%" in out["reason"]
    assert out["bar"] == {"min_benefit": 0.1, "max_regression": 0.03}


def test_report_compare_refuses_repeats_whose_plans_set_different_bars(strict_repeats_log, capsys):
    assert main(["report", "compare", str(strict_repeats_log), "--windows", "c1", "--baseline", "s1"]) == 2
    said = capsys.readouterr().err
    assert "repeats are not matched: acceptance differs" in said and "min_benefit 0.1 vs 0.05" in said


@pytest.fixture
async def roomy_log(tmp_path):
    from tests.policy_world import plan_builtins
    db = tmp_path / "roomy.db"
    await write_window(db, plan=plan_builtins(window_min=200, stop_min=170))
    return db


def test_the_trace_report_pairs_off_and_on_arms_at_c1_and_c4_with_descriptive_differences(roomy_log):
    r = build_report(roomy_log, "w-report")
    pairs = r["trace"]["pairs"]
    assert {p["concurrency"] for p in pairs} == {1, 4} and len(pairs) == 6
    assert all(p["measured"] and p["ttft_p50_s_on_minus_off"] is not None for p in pairs)
    assert "descriptive" in r["trace"]["note"]
    arms = r["trace"]["arms"]
    assert len(arms) == 12 and all(a["latency_p90_s"] >= a["latency_p50_s"] for a in arms)
    md = render_md(r)
    assert "on−off" in md and "| C4 | r3 |" in md
    assert "TTFT p50 on−off" in render_html(r)


def test_each_started_phase_shows_its_estimate_next_to_its_actual_end(roomy_log):
    r = build_report(roomy_log, "w-report")
    started = [c for c in r["cells"] if c["started_minute"] is not None]
    assert started and all(c["ended_minute"] >= c["started_minute"] and c["estimated_end_minute"] for c in started)
    md = render_md(r)
    assert "## Schedule: estimate against actual" in md and "| A.forward_prime | measured |" in md


async def test_status_the_live_view_and_the_report_read_the_same_fold_of_the_log(log):
    from flare_diag.events.progress import WindowProgress
    from flare_diag.events.reader import LogReader
    r = build_report(log, "w-report")
    p = WindowProgress()
    with LogReader(log) as reader:
        for e in reader.iter():
            p.apply(e.seq, e.event(), e.wall_ns)
    st = p.as_dict()
    assert st["outcome"] == r["outcome"] and st["verdict"] == r["verdict"]["hypothesis"]
    assert st["cells"] == {c["phase"]: c["status"] for c in r["cells"]}
    assert st["minute"] == r["timeline"][-1]["minute"]  # the window-closed minute, rounded the same way


def test_a_churn_verdict_names_the_reproducer_command_for_its_window(default_rehearsal):
    _rc, r, out = default_rehearsal
    assert r["verdict"]["hypothesis"] == "row_checkpoint_churn"
    cmd = f"flare-diag reproduce LOG --window {r['window_id']} --policies"
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert cmd in md and md.index(cmd) < md.index("## Cells")
    assert cmd in html and html.index(cmd) < html.index("id=cells")


def test_other_verdicts_do_not_name_the_reproducer(log):
    r = build_report(log, "w-report")
    r["verdict"] = {**r["verdict"], "hypothesis": "not_reproduced"}
    assert "flare-diag reproduce" not in render_md(r) and "flare-diag reproduce" not in render_html(r)


def test_a_reuse_panel_of_a_long_phase_draws_a_bounded_number_of_columns_and_misses_no_reuse():
    from flare_diag.daemon.reports.charts import MAX_POINTS, columns_grid
    reused_at = set(range(0, 100_000, 997))
    svg = columns_grid("reuse", [("A.long", [(i, 5.0 if i in reused_at else 0.0) for i in range(100_000)])],
                       "replay order (request index)", "host reused (tokens)")
    assert 0 < svg.count("<rect") <= MAX_POINTS
    assert svg.count("<rect") >= len(reused_at) * 0.99  # each reuse lands in a column of its own (one bucket may hold two)


def test_drain_checks_are_summarised_and_shown_open_when_one_did_not_settle(log):
    r = build_report(log, "w-report")
    assert r["drains"] and all(d["settled"] for d in r["drains"])
    assert "<details><summary>" + f"{len(r['drains'])} drains, all settled" in render_html(r)
    r["drains"][0] = {**r["drains"][0], "settled": False}
    assert "<details open><summary>" + f"{len(r['drains'])} drains, 1 did NOT settle" in render_html(r)


def test_the_drain_chart_draws_one_row_per_phase_against_the_plans_drain_limit(log):
    from flare_diag.daemon.reports.report_html import drain_chart
    r = build_report(log, "w-report")
    svg = drain_chart(r)
    phases = {d["purpose"].split(" ", 1)[1] for d in r["drains"] if d["purpose"].startswith(("before ", "after "))}
    assert svg.count('<text class="row"') == len(phases)  # a row per phase (and the restore's), not one per drain
    assert svg.count("<circle") == len([d for d in r["drains"] if d["purpose"] != "quiesce"]) + 2  # + the legend's
    assert 'class="limit"' in svg and f"limit {r['timing']['drain_timeout_s']:g} s" in svg


def test_a_drain_that_did_not_settle_is_a_cross_at_the_value_it_gave_up_at(log):
    from flare_diag.daemon.reports.report_html import drain_chart
    r = build_report(log, "w-report")
    k = next(i for i, d in enumerate(r["drains"]) if d["purpose"].startswith("after "))
    r["drains"][k] = {**r["drains"][k], "settled": False, "waited_s": 10.0}
    svg = drain_chart(r)
    assert svg.count('class="unsettled"') == 1 and "did not settle</title>" in svg


def test_the_drain_summary_names_the_longest_wait_against_its_limit_and_the_poll_resolution(log):
    from flare_diag.daemon.reports.report_view import drain_summary
    r = build_report(log, "w-report")
    said = drain_summary(r)
    assert f"of its {r['timing']['drain_timeout_s']:g} s limit" in said
    assert f"to the {r['timing']['drain_poll_s']:g} s poll" in said
    assert said in render_md(r)


def test_the_counter_chart_breaks_each_line_between_incarnations_instead_of_drawing_the_reset():
    from flare_diag.daemon.reports.report_html import per_incarnation
    a = [(1.0, 0.0), (5.0, 100.0), (9.0, 250.0)]
    b = [(12.0, 0.0), (15.0, 40.0)]
    drawn = per_incarnation(a + b, loads=[1.0, 11.0])
    assert drawn == [*a, (12.0, None), *b]  # a break, not a line from 250 down to 0
    # a fall between two scrapes with no load recorded between them is a new incarnation too
    assert per_incarnation(a + b, loads=[]) == [*a, (12.0, None), *b]


def test_a_chart_line_stops_at_a_break_and_starts_again_after_it():
    from flare_diag.daemon.reports.charts import lines
    svg = lines("c", [("s", [(0.0, 1.0), (1.0, 2.0), (2.0, None), (2.0, 0.0), (3.0, 1.0)])], "x", "y")
    assert svg.count("<polyline") == 2


@pytest.fixture(scope="module")
def unmatched_log(tmp_path_factory) -> Path:
    """Three candidate and three baseline repeats, and one window each that differs in its fixtures, its
    concurrency or its identity."""
    import copy

    from tests.policy_world import plan_builtins
    db = tmp_path_factory.mktemp("unmatched") / "log.db"
    base = plan_builtins()
    base.pop("trace", None)  # the trace arms and the optional control are not what is matched: leave them out
    base["phases"] = [ph for ph in base["phases"] if not ph.get("optional")]
    fixtures, concurrency, identity = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    for ph in fixtures["phases"]:
        if ph.get("fixture") == "c1-52":
            ph["fixture"] = "tok1024"
    for ph in concurrency["phases"]:
        if ph["id"] == "A.reverse_replay":
            ph["concurrency"] = 4
    identity["identity"]["model"] = "another-model"

    async def write() -> None:
        for w in ("c1", "c2", "c3", "b1", "b2", "b3"):
            await write_window(db, window_id=w, plan=base)
        for w, plan in (("fixtures", fixtures), ("concurrency", concurrency), ("identity", identity)):
            await write_window(db, window_id=w, plan=plan)
    asyncio.run(write())
    return db


@pytest.mark.parametrize("field,named", [("fixtures", "bytes"), ("concurrency", "[1] vs [1, 4]"),
                                         ("identity", "model dec48abd vs another-model")])
def test_report_compare_refuses_repeats_that_differ_naming_the_field(unmatched_log, capsys, field, named):
    assert main(["report", "compare", str(unmatched_log), "--windows", "c1", "c2", field,
                 "--baseline", "b1", "b2", "b3"]) == 2
    err = capsys.readouterr().err
    assert f"repeats are not matched: {field} differs between window c1 and window {field}" in err and named in err


def test_report_compare_uses_exactly_the_repeats_asked_for(unmatched_log, capsys):
    assert main(["report", "compare", str(unmatched_log), "--windows", "c1", "c2", "c3", "b1",
                 "--baseline", "b2", "b3"]) == 2
    assert "exactly 3 repeats a side" in capsys.readouterr().err


def test_report_compare_says_whether_noise_could_explain_each_difference(repeats_log, capsys):
    assert main(["report", "compare", str(repeats_log), "--windows", "c1", "c2", "c3", "--baseline", "b1", "b2", "b3",
                 "--json"]) == 1
    stats = json.loads(capsys.readouterr().out)["statistics"]
    ttft = stats["median_ttft_ms"]
    assert set(stats) == {"median_ttft_ms", "p95_end_to_end_ms", "decode_ms_per_token"}
    assert ttft["change"] == 0 and ttft["noise_could_explain"] and len(ttft["interval"]) == 2


def test_the_verdict_is_said_in_words_first_with_its_code_name_beside_it(log):
    from flare_diag.daemon.reports.report_view import VERDICT_WORDS
    r = build_report(log, "w-report")
    hyp = r["verdict"]["hypothesis"]
    assert f"## Verdict\n\n**{VERDICT_WORDS[hyp]}** (`{hyp}`)" in render_md(r)


def test_counts_in_the_cells_table_carry_thousands_separators(log):
    from flare_diag.daemon.reports.report_view import cell_rows
    r = build_report(log, "w-report")
    big = next(c for c in r["cells"] if (c.get("host") or {}).get("reused_tokens") or 0 >= 1000)
    row = next(x for x in cell_rows(r) if x[0] == big["phase"])
    assert f"{big['host']['reused_tokens']:,}" in row[4] and "," in row[4]



def test_every_count_of_four_digits_or_more_in_the_rehearsals_md_and_html_carries_thousands_separators(default_rehearsal):
    import re
    _rc, r, out = default_rehearsal
    # a bare integer: not part of a hash, an id, a date, a time, a decimal or a number already grouped
    bare = re.compile(r"(?<![\w.,:/+#&;-])\d{4,}(?![\w.,:/-])")
    for fmt in ("md", "html"):
        text = (out / f"report.{fmt}").read_text()
        found = [text[max(0, m.start() - 40):m.end() + 10] for m in bare.finditer(text)]
        assert not found, (fmt, found[:5])
    reused = next(c for c in r["cells"] if c["phase"] == "A.reverse_replay")["host"]["reused_tokens"]
    verdict = (out / "report.md").read_text().split("## Verdict", 1)[1].split("\n\n")[1]
    assert reused >= 1000 and f"reused {reused:,} host tokens" in verdict  # grouped where it is first said
    assert f"reused {reused} host tokens" in r["verdict"]["basis"]  # the log keeps the policy's own words

def test_an_operators_abort_names_who_asked_in_the_report(tmp_path):
    import asyncio

    from flare_diag.daemon.reports.report_md import render_md as md
    from flare_diag.events.schema import OperatorAbort
    from tests.logtools import write_window
    db = tmp_path / "log.db"

    sent = []

    def abort_at(world, history):
        if len(history) >= 40 and not sent:
            sent.append(1)
            return OperatorAbort(at_ns=world.now, reason="pager says the pool is hot", uid=1042, pid=4242)
        return None
    asyncio.run(write_window(db, window_id="w-abort", hook=abort_at))
    r = build_report(db, "w-abort")
    assert r["abort"]["reason"] == "operator" and (r["abort"]["uid"], r["abort"]["pid"]) == (1042, 4242)
    assert "asked by uid 1042, pid 4242: pager says the pool is hot" in md(r)


def test_reports_streamed_from_the_log_are_byte_for_byte_the_reports_rendered_in_memory(default_rehearsal, tmp_path):
    from flare_diag.daemon.reports.publish import write_reports
    from flare_diag.events.reader import LogReader
    db = default_rehearsal[2] / "log.db"
    with LogReader(db) as r:
        wid = next(iter(r.window_ids()))
    (tmp_path / "whole").mkdir()
    (tmp_path / "streamed").mkdir()
    write_report_files(build_report(db, wid), tmp_path / "whole")
    streamed = write_reports(db, wid, tmp_path / "streamed")
    assert streamed["requests"] == []  # the rows went to the files, not into memory
    for fmt in FORMATS:
        whole, out = (tmp_path / "whole" / f"report.{fmt}").read_bytes(), (tmp_path / "streamed" / f"report.{fmt}").read_bytes()
        assert whole == out, fmt
    assert json.loads((tmp_path / "streamed" / "report.json").read_text())["requests"]


def test_a_published_snapshot_streamed_from_the_log_holds_the_same_files(default_rehearsal, tmp_path):
    from flare_diag.daemon.reports.publish import publish_window
    from flare_diag.events.reader import LogReader
    db = default_rehearsal[2] / "log.db"
    with LogReader(db) as r:
        wid = next(iter(r.window_ids()))
    _report, folder = publish_window(db, wid, tmp_path)
    for fmt in FORMATS:
        assert (folder / f"report.{fmt}").read_bytes() == (default_rehearsal[2] / f"report.{fmt}").read_bytes(), fmt


@pytest.mark.parametrize("time_scale", [1.0, 20.0])
def test_a_long_window_spooled_in_one_pass_gives_the_bytes_of_the_report_held_in_memory(tmp_path, time_scale):
    """Past the chart's point budget, with natural failures, and on a clock faster than the wall's (a
    column more): the spooled report (request rows, counter series and failures written as they are
    made) is the in-memory report, byte for byte."""
    import importlib.util
    from flare_diag.daemon.reports.publish import write_reports
    spec = importlib.util.spec_from_file_location("bench_report", Path(__file__).resolve().parent.parent / "bench" / "report.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    db = tmp_path / "log.db"
    asyncio.run(bench._fill(db, 12_000, time_scale=time_scale))  # ~2,000 requests and scrapes: the chart thins them
    (tmp_path / "whole").mkdir()
    (tmp_path / "spooled").mkdir()
    whole = build_report(db, bench.WINDOW)
    assert len(whole["counters"]["minute"]) > 1200 and len(whole["natural_failures"]) > 100
    write_report_files(whole, tmp_path / "whole")
    spooled = write_reports(db, bench.WINDOW, tmp_path / "spooled")
    assert spooled["requests"] == [] and spooled["counters"]["minute"] == [] and spooled["natural_failures"] == []
    for fmt in FORMATS:
        assert (tmp_path / "whole" / f"report.{fmt}").read_bytes() == (tmp_path / "spooled" / f"report.{fmt}").read_bytes(), fmt
    assert ("end (wall s)" in (tmp_path / "spooled" / "report.md").read_text()) == (time_scale != 1.0)


def test_a_reader_skipping_sends_and_scrapes_leaves_out_exactly_their_decisions(log):
    from flare_diag.events.reader import LogReader
    with LogReader(log) as r:
        every = list(r.iter_for_projection("w-report"))
        kept = [e.seq for e in r.iter_for_projection("w-report", skip_actions=("send_request", "scrape_metrics"))]
    decisions = {e.seq: e.event().action for e in every if e.type == "action_requested"}
    left_out = {seq for seq, action in decisions.items() if action in ("send_request", "scrape_metrics")}
    assert {"send_request", "scrape_metrics"} <= set(decisions.values()) and len(set(decisions.values())) > 2
    assert kept == [e.seq for e in every if e.seq not in left_out]


def _report_from_every_event(db: Path, window_id: str) -> dict:
    """A window's report projected from all its events, as a copy of the log that cannot leave rows
    out in SQL (the fleet's central one) hands them over."""
    from flare_diag.daemon.reports.publish import integrity_of
    from flare_diag.events.reader import LogReader
    from flare_diag.events.report import project_window
    with LogReader(db) as r:
        return project_window(r.iter(window_id=window_id), window_id, integrity_of(r, window_id))


def test_a_report_read_without_the_sends_and_scrapes_decisions_is_the_report_of_every_event(default_rehearsal, tmp_path):
    from flare_diag.events.reader import LogReader
    db = default_rehearsal[2] / "log.db"
    with LogReader(db) as r:
        wid = next(iter(r.window_ids()))
    narrowed = build_report(db, wid)
    assert narrowed["counters"]["minute"] and narrowed["requests"] and narrowed["identity"]["observed"]
    assert narrowed == _report_from_every_event(db, wid)


def test_a_long_windows_report_read_without_its_scrapes_decisions_has_every_scrape(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_report", Path(__file__).resolve().parent.parent / "bench" / "report.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    db = tmp_path / "log.db"
    asyncio.run(bench._fill(db, 3_000))
    narrowed = build_report(db, bench.WINDOW)
    assert len(narrowed["counters"]["minute"]) == len(narrowed["requests"]) > 400  # one scrape a request
    assert narrowed == _report_from_every_event(db, bench.WINDOW)


def test_every_command_a_report_gives_names_a_subcommand_and_options_the_cli_has(default_rehearsal):
    from tests.test_docs import _parsers, misnamed
    md = (default_rehearsal[2] / "report.md").read_text()
    assert "`flare-diag reproduce " in md  # the report's reproducer line: what this test reads
    assert misnamed(md, _parsers()) == []


@pytest.mark.parametrize("data", [
    {"families": 12, "note": "fits a scrape's shape"},
    {"counters": ["not", "an", "object"], "gauges": "nor this"},  # a scrape's view refuses it
    {"counters": {"host_hits": "n/a"}},  # a counter that is not a number
], ids=["fits", "counters-a-list", "counter-not-a-number"])
def test_a_snapshot_answer_is_shown_as_stored_whatever_its_data_looks_like(data):
    """The projection reads each answer as a scrape's first (most of a long window's are): a snapshot's
    answer, whether or not its data fits that shape, is still shown exactly as the host gave it."""
    from flare_diag.events.actions import ScrapeMetrics, Snapshot
    from flare_diag.events.base import encode_payload
    from flare_diag.events.envelope import ReadEvent
    from flare_diag.events.report import project
    from flare_diag.events.schema import ActionDone, ActionRequested, WindowOpened
    events = [WindowOpened(at_ns=0, window_id="w", plan={"name": "p"}, plan_sha256="0" * 64, site="s",
                           gpu_source="sim", rehearsal=True, candidate_recipe="c"),
              ActionRequested(action_id=1, request=Snapshot(what="monitoring")),
              ActionDone(at_ns=1, action_id=1, ok=True, data=data),
              ActionRequested(action_id=2, request=ScrapeMetrics()),
              ActionDone(at_ns=2, action_id=2, ok=True, data={"counters": {"host_hits": 7}, "gauges": {}})]
    envs = [ReadEvent(i + 1, i, type(e).__struct_config__.tag, type(e).schema_v, "w", encode_payload(e))
            for i, e in enumerate(events)]
    r = project(envs, "w", {"events": 5, "head_seq": 5, "head_hash": "", "chain_ok": True, "audit_ok": True})
    assert r["snapshots"]["before"]["monitoring"]["data"] == data
    assert r["counters"]["host_hits"] == [7]  # the scrape after it is still read as one


def test_an_identity_that_matched_is_one_line_per_run_of_reads_and_no_table(default_rehearsal):
    _rc, r, out = default_rehearsal
    md = (out / "report.md").read_text()
    section = md.split("### Identity", 1)[1].split("###", 1)[0]
    reads = [line for line in section.splitlines() if line.startswith("- ") and "as expected" in line]
    assert reads and "DIFFERS" not in section and "| field |" not in section
    assert len(section.splitlines()) < 30  # one line a run of reads, never a column per read


def test_the_trace_arms_switching_trace_do_not_split_an_incarnations_identity_line(default_rehearsal):
    _rc, r, out = default_rehearsal
    md = (out / "report.md").read_text()
    section = md.split("### Identity", 1)[1].split("###", 1)[0]
    b_lines = [line for line in section.splitlines() if line.startswith("- incarnation B")]
    assert len(b_lines) == 1, b_lines
    assert "trace_enabled changed" in b_lines[0] and "as expected" in b_lines[0]


def test_an_identity_that_differs_names_only_the_fields_that_differ_with_both_values(small_plan, tmp_path):
    from tests.test_fault_matrix import rehearse
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", "identity_drift")
    md = (tmp_path / "out" / "report.md").read_text()
    line = next(x for x in md.splitlines() if "DIFFERS" in x)
    want = r["identity"]["expected"]["image"]
    assert f"DIFFERS in 1 of {len(r['identity']['expected'])} fields: image expected {want}, found 0badc0de" in line
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<span class=mism>DIFFERS in 1 of" in html


def _with_forecast(r: dict, outcome: str) -> dict:
    alarm = {"kind": "projected_overrun", "detail": "the required cells' projected end is minute 71.2, past the stop "
                                                    "minute 70", "minute": 30.0}
    return {**r, "outcome": outcome, "alarms": [*(r.get("alarms") or []), alarm]}


def test_a_projected_overrun_that_cost_no_required_cell_is_not_listed_as_needing_attention(log):
    from flare_diag.daemon.reports.report_view import needs_attention
    r = _with_forecast(build_report(log, "w-report"), "completed")
    assert not [x for x in needs_attention(r) if "projected_overrun" in x]
    md = render_md(r)
    assert "projected_overrun: the required cells' projected end" in md and "it did not come true" in md


def test_a_projected_overrun_in_a_window_that_ended_partial_needs_attention(log):
    from flare_diag.daemon.reports.report_view import needs_attention
    r = _with_forecast(build_report(log, "w-report"), "partial")
    assert [x for x in needs_attention(r) if x.startswith("alarm projected_overrun")]
    assert "it did not come true" not in render_md(r)


def test_a_projected_overrun_in_an_aborted_window_claims_nothing_about_whether_it_came_true(log):
    md = render_md(_with_forecast(build_report(log, "w-report"), "aborted"))
    assert "the window ended aborted before it could come true or not" in md and "it did not come true" not in md


def test_the_report_schema_admits_every_abort_reason_the_policy_can_decide():
    # engine_restart and rejected (contract 4, amended 2026-12-03) were decided but not admitted: a report of
    # such an abort did not validate
    from typing import get_args

    from flare_diag.events.report_schema import AbortReason
    from flare_diag.policies.rules import ABORT_REASONS
    assert set(get_args(AbortReason)) == set(ABORT_REASONS)


def _stamped_a_quarter_by_reads(world, _history):
    world.first_token_stamp = "read" if world.requests_sent % 4 == 0 else "kernel"


async def test_the_report_says_how_many_first_tokens_the_kernel_stamped_and_what_the_rest_mean(tmp_path):
    await write_window(tmp_path / "s.db", hook=_stamped_a_quarter_by_reads)
    r = build_report(tmp_path / "s.db", "w-report")
    kernel = sum(x["ttft_kernel_stamped"] for x in r["latency"])
    read = sum(x["ttft_read_stamped"] for x in r["latency"])
    assert kernel > read > 0 and kernel + read == sum(x["requests"] for x in r["latency"])
    said = f"First tokens timed by the kernel's receive stamp of their bytes: {kernel:,} of {kernel + read:,}. {read:,} were"
    assert said in render_md(r) and html.escape(said) in render_html(r)


def test_a_report_of_a_host_in_the_daemons_process_says_nothing_of_stamps(log):
    r = build_report(log, "w-report")
    assert {(x["ttft_kernel_stamped"], x["ttft_read_stamped"]) for x in r["latency"]} == {(0, 0)}
    assert "receive stamp" not in render_md(r)


async def test_the_trace_overhead_says_when_its_arms_first_tokens_were_timed_as_read(tmp_path):
    await write_window(tmp_path / "s.db", hook=_stamped_a_quarter_by_reads)
    r = build_report(tmp_path / "s.db", "w-report")
    arms = [x for x in r["latency"] if x["phase"].startswith("trace.C")]
    read = sum(x["ttft_read_stamped"] for x in arms)
    timed = read + sum(x["ttft_kernel_stamped"] for x in arms)
    assert read > 0
    said = f"{read:,} of the trace arms' {timed:,} first tokens were timed as the daemon read them"
    overhead = next(x for x in render_md(r).splitlines() if x.startswith("Trace overhead "))
    assert said in overhead


def _all_kernel_stamped(world, _history):
    world.first_token_stamp = "kernel"


async def test_the_trace_overhead_says_nothing_of_stamps_when_the_kernel_stamped_every_first_token(tmp_path):
    await write_window(tmp_path / "k.db", hook=_all_kernel_stamped)
    md = render_md(build_report(tmp_path / "k.db", "w-report"))
    assert "First tokens timed by the kernel's receive stamp" in md and "timed as the daemon read them" not in md
