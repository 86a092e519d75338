"""The command line as a user meets it: help, version, JSON outputs, pipes, the simulator's token."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flare_diag.daemon.cli.commands import build_parser, main
from tests.logtools import write_window

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"


def _parsers(p: argparse.ArgumentParser, path: str = "flare-diag"):
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _parsers(sp, f"{path} {name}")


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("cli-log") / "log.db"
    asyncio.run(write_window(db))
    return db


def test_every_option_of_every_subcommand_has_help_text():
    missing = [f"{path} {a.option_strings or a.dest}" for path, p in _parsers(build_parser()) for a in p._actions
               if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()]
    assert not missing, missing


def test_every_option_of_the_daemon_has_help_text():
    from flare_diag.daemon.service.server import build_parser as build_daemon_parser
    missing = [str(a.option_strings) for a in build_daemon_parser()._actions if not (a.help or "").strip()]
    assert not missing, missing


def test_version_prints_the_installed_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("flare-diag ")


def test_a_cli_call_loads_neither_the_simulated_host_nor_the_metadata_to_build_its_parser():
    # a third of every CLI call was the host and cache model (for two lists in the help text) and the
    # installed metadata (for --version): a fresh interpreter shows what building the parser loads
    probe = ("import sys; from flare_diag.daemon.cli.commands import build_parser; build_parser(); "
             "print(sorted(m for m in ('flare_diag.fixtures.flaresim.host', 'flare_diag.fixtures.flaresim.cache', "
             "'importlib.metadata') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_each_commands_parser_built_alone_is_the_one_in_the_whole_command_line():
    # a call builds only the parser of the command it names (start-up, issue 49): that parser must be the
    # very one the whole command line has, help text, flags and defaults alike
    whole = dict(_parsers(build_parser()))
    for name in build_parser()._subparsers._group_actions[0].choices:  # type: ignore[union-attr]
        alone = build_parser(only=name)
        assert alone.only_found
        for path, parser in list(_parsers(alone))[1:]:  # the top level's own help is only ever the whole one's
            assert parser.format_help() == whole[path].format_help(), path
    assert not build_parser(only="statu").only_found  # not a command: main builds the whole parser to say so


def test_status_against_no_daemon_loads_neither_rich_nor_the_event_schema_nor_other_commands_parsers():
    probe = ("import sys; from flare_diag.daemon.cli.commands import main; main(['status', '--socket', '/nonexistent/s']); "
             "print(sorted(m for m in ('rich.console', 'flare_diag.events.schema', 'flare_diag.daemon.cli.fleet_commands', "
             "'flare_diag.policies.ranges', 'importlib.resources') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("command", [["start", "PLAN", "--site", "flare"], ["abort", "--reason", "a drill"], ["status"]])
def test_a_daemon_client_call_loads_neither_the_host_api_nor_the_live_view(tmp_path, command):
    # a `start` without --calibrate loaded the forecast, and with it httpx and the host API: half of
    # its CPU, in every operator's start; the live view's (rich's live display, the report's words) is
    # for `watch` alone
    plan = str(ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml")
    args = [plan if a == "PLAN" else a for a in command] + ["--socket", str(tmp_path / "none.sock")]
    probe = ("import sys; from flare_diag.daemon.cli.commands import main; rc = main(sys.argv[1:]); "
             "print(rc, sorted(m for m in ('httpx', 'flare_diag.daemon.window.forecast', 'flare_diag.daemon.cli.live', "
             "'rich.live') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True)
    assert p.stdout.split(" ", 1) == ["5", "[]\n"], p.stdout + p.stderr  # 5: no daemon there


def test_no_arguments_print_the_help_and_exit_2(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert "usage: flare-diag" in out and "rehearse" in out and "plan" in out


def test_rehearse_help_lists_the_scenarios_and_the_fault_kinds(capsys):
    with pytest.raises(SystemExit):
        main(["rehearse", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "churn, flare-47581cca, ineligible, large-rows" in out
    assert "identity_drift" in out and "router_hang" in out


@pytest.mark.parametrize("args", [["plan", "check", str(PLAN), "--json"], ["plan", "forecast", str(PLAN), "--json"]])
def test_plan_commands_with_json_print_one_json_object(capsys, args):
    assert main(args) == 0
    assert isinstance(json.loads(capsys.readouterr().out), dict)


@pytest.mark.parametrize("cmd", ["verify", "audit"])
def test_log_commands_with_json_print_one_json_object(capsys, log, cmd):
    assert main(["log", cmd, str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_log_export_into_a_pipe_closed_after_one_line_exits_0_with_no_traceback(log):
    p = subprocess.Popen([sys.executable, "-m", "flare_diag.daemon.cli", "log", "export", str(log)], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.readline()  # type: ignore[union-attr]
    p.stdout.close()  # type: ignore[union-attr]  # as `head -1` does once it has its line
    err = p.stderr.read().decode()  # type: ignore[union-attr]
    assert p.wait(30) == 0, err
    assert json.loads(first)["seq"] == 1 and "Traceback" not in err and err == ""


def test_sim_serve_makes_a_token_prints_it_and_wants_it(tmp_path):
    import httpx
    p = subprocess.Popen([sys.executable, "-m", "flare_diag.daemon.cli", "sim", "serve", "--port", "0"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        token = p.stdout.readline().split()[-1]  # type: ignore[union-attr]
        url = p.stdout.readline().split()[3]  # type: ignore[union-attr]
        assert len(token) == 32
        assert httpx.get(f"{url}/health").status_code == 401
        assert httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    finally:
        p.terminate()
        p.wait(10)


def test_rehearse_into_a_pipe_does_not_wrap_its_lines_at_80_columns(tmp_path, small_plan):
    import os
    out = tmp_path / ("a-folder-name-long-enough-that-the-reports-line-runs-past-eighty-columns" * 2)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "rehearse", "--plan", str(small_plan), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    reports = [line for line in p.stdout.splitlines() if line.startswith("reports: ")]
    assert len(reports) == 1 and reports[0].endswith("(chain ok, audit ok)") and str(out) in reports[0]


def test_windows_lists_a_logs_windows_with_outcome_verdict_restoration_and_report(tmp_path, small_plan, capsys):
    from tests.simtools import flare_diag_here
    out = tmp_path / "out"
    rc, _stdout, _stderr = flare_diag_here("rehearse", "--plan", str(small_plan), "--out", str(out))
    assert rc == 0
    assert main(["windows", str(out / "log.db"), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 1 and rows[0]["outcome"] == "completed" and rows[0]["restoration_verified"] is True
    assert rows[0]["verdict"] and rows[0]["report"] == str(out / "report.json")
    assert main(["windows", str(out / "log.db")]) == 0
    line = capsys.readouterr().out
    assert rows[0]["window_id"] in line and "restoration verified" in line


def test_windows_of_a_missing_log_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["windows", str(tmp_path / "nope.db")]) == 2
    err = capsys.readouterr().err
    assert "no such log file" in err and err.count("\n") == 1


def test_rehearse_with_json_prints_json_lines_only_and_ends_with_the_result(tmp_path, small_plan):
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "rehearse", "--plan", str(small_plan), "--out", str(out),
                        "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    assert lines[-1] == {"type": "result", "window_id": lines[0]["window_id"], "outcome": "completed",
                         "verdict": lines[-1]["verdict"], "restoration_verified": True, "chain_ok": True, "audit_ok": True,
                         "log": str(out / "log.db"), "exit_code": 0,
                         "reports": {f: str(out / f"report.{f}") for f in ("json", "md", "html")}}
    events = lines[:-1]
    assert events[0]["type"] == "window_opened" and events[-1]["type"] == "window_closed"
    assert len(events) == len(list(_log_seqs(out / "log.db")))  # every event of the log, once
    assert "reports:" in p.stderr  # what people read goes to stderr


def _log_seqs(db: Path):
    from flare_diag.events.reader import LogReader
    with LogReader(db) as r:
        return [e.seq for e in r.iter()]


def _live_view_of_eight_bodies(small_plan):
    """A live view fed the opening of a window of the eight-body plan, its fixture validated (8 bodies)."""
    import io

    import msgspec
    from rich.console import Console

    from flare_diag.daemon.cli.live import LiveView
    from flare_diag.daemon.window.setup import read_plan
    from flare_diag.events.actions import ValidateFixtures
    from flare_diag.events.schema import ActionDone, ActionRequested, WindowOpened
    _raw, plan = read_plan(small_plan)
    view = LiveView(Console(file=io.StringIO(), width=160))
    view.on_event(1, WindowOpened(at_ns=0, window_id="w", plan=msgspec.to_builtins(plan), plan_sha256="x", site="s",
                                  gpu_source="simulator", rehearsal=True, candidate_recipe="c"))
    view.on_event(2, ActionRequested(action_id=1, request=ValidateFixtures(fixtures=[])))
    view.on_event(3, ActionDone(at_ns=0, action_id=1, ok=True, data={"fixtures": {"tok1024": {"sha256": ["a"] * 8}}}))
    return view


def test_the_live_view_shows_done_of_total_the_etas_the_wall_clock_and_the_stop_mark(small_plan):
    import io

    from rich.console import Console

    from flare_diag.daemon.cli.live import panel
    from flare_diag.events.schema import PhaseStarted, RequestMeasured
    view = _live_view_of_eight_bodies(small_plan)
    view.on_event(4, PhaseStarted(phase="A.forward_prime", minute=1.0, estimated_end_minute=3.5))
    for k in range(3):
        view.on_event(5 + k, RequestMeasured(phase="A.forward_prime", order_index=k, body_index=k, body_sha256="a",
                                             outcome="ok", natural_failure=None, delta={}))
    text = io.StringIO()
    Console(file=text, width=120).print(panel(view.progress, 0.0, 75.0))
    shown = text.getvalue()
    assert "A.forward_prime: 3/8 requests" in shown  # the phase's total from the fixture the window validated
    assert "phase end at minute 3.5" in shown and "stop minute 70 in" in shown
    assert "wall clock 0:01:15" in shown
    # one window minute in 75 wall seconds: the ETAs say their wall-clock time too (2.5 min -> 0:03:07)
    assert "(in 2.5 min (~0:03:07 wall clock))" in " ".join(shown.split())
    assert "┃" in shown and "70 stop" in shown and "90 end" in shown  # the bar's marks


def test_a_command_for_the_daemon_with_no_daemon_listening_exits_5_in_one_line(tmp_path, capsys):
    assert main(["status", "--socket", str(tmp_path / "none.sock")]) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no flare-diagd listening" in err[0]


def test_the_top_level_help_ends_with_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # the help wraps at the terminal's width
    assert "exit codes: 0 completed" in out and "5 the daemon is not reachable" in out


def test_report_takes_an_out_folder_for_the_log_it_holds(default_rehearsal, capsys):
    out = default_rehearsal[2]
    assert main(["report", str(out), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["window_id"] == default_rehearsal[1]["window_id"]


def test_share_says_where_the_host_api_reference_is_installed(capsys):
    assert main(["share", "--json"]) == 0
    path = Path(json.loads(capsys.readouterr().out)["host_api"])
    assert path.is_file() and "/flare/v1/identity" in path.read_text()


def test_the_bash_completion_offers_each_commands_own_subcommands_and_flags(tmp_path, capsys):
    import shutil
    import subprocess
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "flare-diag.bash"
    script.write_text(capsys.readouterr().out)

    def complete(*words: str) -> list[str]:
        line = " ".join(f'"{w}"' for w in ("flare-diag", *words))
        p = subprocess.run(["bash", "-c", f'source "{script}"; COMP_WORDS=({line}); COMP_CWORD={len(words)}; '
                                          f'_flare_diag; printf "%s\\n" "${{COMPREPLY[@]}}"'],
                           capture_output=True, text=True, timeout=30)
        return p.stdout.split()
    assert complete("plan", "fo") == ["follow-on", "forecast"]
    assert set(complete("fleet", "campaign", "")) >= {"create", "show"}
    assert "--candidate" in complete("rehearse", "--c")


def test_a_daemon_that_never_answers_is_one_line_not_a_traceback(tmp_path):
    """A socket that accepts and never replies: the client's deadline ends in DaemonUnreachable (exit 5,
    one line), never in a TimeoutError's traceback."""
    import socket as socketlib

    from flare_diag.daemon.cli.client import Connection, DaemonUnreachable
    from flare_diag.daemon.service import control
    path = tmp_path / "mute.sock"
    server = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    try:
        c = Connection(path, timeout=1.0)
        try:
            with pytest.raises(DaemonUnreachable, match="did not answer within 1 s"):
                c.call(control.Status())
        finally:
            c.close()
    finally:
        server.close()


def test_plan_check_refuses_a_fixture_whose_bodies_ask_another_sampling_as_rehearse_does(tmp_path, capsys):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.read_text().replace("\ntemperature = 1.0\n", "\ntemperature = 0.7\n", 1))
    assert main(["plan", "check", str(plan)]) == 2
    err = capsys.readouterr().err
    assert "fixture c1-52" in err and "the plan's [sampling] says 0.7" in err and len(err.strip().splitlines()) == 1


def test_plan_check_searches_beside_the_site_profile_as_run_does(tmp_path, capsys):
    import shutil
    site = tmp_path / "site"
    shutil.copytree(ROOT / "fixtures" / "data" / "c1-52", site / "ours-52")
    assert main(["init-site", "flare", str(site), "--name", "site"]) == 0  # read whole, as run reads it
    for token in site.glob("*.token"):
        token.write_text("t0ken-for-the-test\n")
    plan = tmp_path / "plans" / "plan.toml"
    plan.parent.mkdir()
    plan.write_text(PLAN.read_text().replace('"c1-52"', '"ours-52"'))
    assert main(["plan", "check", str(plan)]) == 2
    assert "fixture 'ours-52'" in capsys.readouterr().err
    assert main(["plan", "check", str(plan), "--site", str(site / "site.toml")]) == 0
    assert "ours-52 (52 bodies)" in capsys.readouterr().out


def _shown(events) -> str:
    import io

    from rich.console import Console

    from flare_diag.daemon.cli.live import LiveView
    out = io.StringIO()
    with LiveView(Console(file=out, width=400)) as view:
        for seq, ev in enumerate(events, 1):
            view.on_event(seq, ev)
    assert view.failed is None
    return out.getvalue()


def test_the_live_view_prints_the_cells_an_abort_left_unstarted_as_one_line_per_status():
    from flare_diag.events.schema import CellRecorded
    lost = "not started: window aborted (gpu_fault)"
    shown = _shown([CellRecorded(phase="A.forward_prime", status="invalid", reason="window aborted after 29 of 52"),
                    *(CellRecorded(phase=p, status="failed", reason=lost) for p in ("A.reverse_replay", "B.identity")),
                    *(CellRecorded(phase=p, status="deferred", reason=lost) for p in ("trace.warmup", "trace.C1"))])
    lines = shown.splitlines()
    assert len(lines) == 3
    assert "failed 2 cells: not started: window aborted (gpu_fault): A.reverse_replay, B.identity" in lines[1]
    assert "deferred 2 cells:" in lines[2] and lines[2].endswith("trace.warmup, trace.C1")


def test_the_close_line_names_the_outcome_the_abort_and_the_restoration():
    from flare_diag.events.actions import Quiesce
    from flare_diag.events.schema import AbortDecided, ActionRequested, RestorationRecorded, WindowClosed
    shown = _shown([ActionRequested(action_id=1, request=Quiesce()),
                    AbortDecided(reason="gpu_fault", detail="Xid 79 on GPU 0", minute=8.5833),
                    RestorationRecorded(checks={"incumbent_sha256_match": True}, verified=True, started_minute=8.6,
                                        finished_minute=9.4),
                    WindowClosed(outcome="aborted", minute=9.4502)])
    last = shown.splitlines()[-1]
    assert last == "window closed: aborted at minute 9.5; abort gpu_fault: Xid 79 on GPU 0; restoration verified"


def test_the_close_line_of_a_failed_restoration_says_the_primary_needs_a_person():
    from flare_diag.events.actions import Quiesce
    from flare_diag.events.schema import ActionRequested, RestorationRecorded, WindowClosed
    shown = _shown([ActionRequested(action_id=1, request=Quiesce()),
                    RestorationRecorded(checks={"incumbent_sha256_match": False, "readmitted": True}, verified=False,
                                        started_minute=60.0, finished_minute=70.0),
                    WindowClosed(outcome="restore_failed", minute=70.0)])
    last = shown.splitlines()[-1]
    assert "restore_failed at minute 70.0" in last
    assert "restoration NOT verified (incumbent_sha256_match): the primary needs a person" in last


def test_the_live_view_names_a_wait_only_once_it_has_lasted_half_a_window_minute(small_plan):
    import io

    from rich.console import Console

    from flare_diag.daemon.cli.live import panel
    from flare_diag.events.actions import make
    from flare_diag.events.schema import ActionRequested, TimeMarked, Tick
    view = _live_view_of_eight_bodies(small_plan)
    view.on_event(4, TimeMarked(mark="t0", minute=0.0))
    view.on_event(5, Tick(at_ns=int(10 * 60e9)))
    view.on_event(6, ActionRequested(action_id=40, request=make("unload", {"recipe": "r", "sha256": "s"}), deadline_s=600.0))
    view.on_event(7, ActionRequested(action_id=41, request=make("scrape_metrics", {}), deadline_s=10.0))

    def shown() -> str:
        text = io.StringIO()
        Console(file=text, width=220).print(panel(view.progress, 0.0, 300.0))
        return " ".join(text.getvalue().split())
    assert "waiting on" not in shown()  # asked this moment: no news
    view.on_event(8, Tick(at_ns=int(11.2 * 60e9)))
    assert "waiting on #40 unload (asked at minute 10, 1.2 min ago; deadline 600 s); #41 scrape_metrics" in shown()


def test_the_live_view_projects_the_phase_end_from_the_phases_own_pace_not_its_starting_estimate(small_plan):
    import io

    from rich.console import Console

    from flare_diag.daemon.cli.live import panel
    from flare_diag.events.schema import ActionDone, PhaseStarted, RequestMeasured, TimeMarked
    view = _live_view_of_eight_bodies(small_plan)
    view.on_event(4, TimeMarked(mark="t0", minute=0.0))
    view.on_event(4, PhaseStarted(phase="A.forward_prime", minute=1.0, estimated_end_minute=3.0))
    # four of eight requests in four minutes: twice as slow as estimated, so the phase ends at minute 9
    for k in range(4):
        view.on_event(5 + 2 * k, ActionDone(at_ns=int((2 + k) * 60e9), action_id=100 + k, ok=True, data={}))
        view.on_event(6 + 2 * k, RequestMeasured(phase="A.forward_prime", order_index=k, body_index=k, body_sha256="a",
                                                 outcome="ok", natural_failure=None, delta={}))
    assert view.progress.minute is not None and view.progress.phase_projected_end == pytest.approx(1 + 4 * 8 / 4, abs=0.2)
    text = io.StringIO()
    Console(file=text, width=220).print(panel(view.progress, 0.0, 300.0))
    shown = " ".join(text.getvalue().split())
    assert "phase end at minute 9.0 by its pace so far" in shown and "estimated 3.0 at its start" in shown


def test_status_lines_put_needs_attention_first_and_say_a_restoration_that_did_not_verify():
    from flare_diag.daemon.cli.client import status_rows
    window = {"window_id": "w1", "rehearsal": False, "phase_requests": 0, "phase_total": None, "stage": "closed",
              "phase": None, "minute": 71.0, "stop_min": 70, "window_min": 90, "requests": 52, "abort": None,
              "restoration_failed": ["incumbent_sha256_match"], "alarms": [{"kind": "primary_left_quiesced", "detail": "x"}],
              "outcome": "restore_failed", "verdict": "inconclusive"}
    rows = dict(status_rows({"pid": 7, "state": "idle", "log": {"path": "/l", "head_seq": 9}, "last_window": window,
                             "needs_attention": {"window_id": "w1", "needs": "restore"}}))
    assert next(iter(rows)) == "NEEDS ATTENTION"
    assert rows["  restoration"] == "not verified: incumbent_sha256_match failed"
    assert rows["  alarm"] == "primary_left_quiesced: x" and rows["  outcome"] == "restore_failed (verdict inconclusive)"
