"""flare-diagd as a process on a unix socket, driven by the CLI; crash and stop recovery."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.daemontools import PLAN, QUICK_LOAD_S, SCALE, Daemon, Sim, SocketThread, in_phase, threads_taking
from flare_diag.events.reader import LogReader

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def sim(tmp_path):
    s = Sim(tmp_path, load_s=QUICK_LOAD_S)
    yield s
    s.stop()


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path)
    yield d
    d.stop()


def _start(daemon: Daemon, sim: Sim) -> str:
    # these windows are about the daemon, not the schedule: at x100 the harness's real latency makes
    # the full plan overrun by the forecast, so they accept a partial window
    p = daemon.cli("start", str(PLAN), "--site", sim.site.stem, "--time-scale", str(SCALE), "--accept-partial")
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1]


def _report(daemon: Daemon, window_id: str) -> dict:
    p = daemon.cli("report", window_id, "--format", "json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _events(daemon: Daemon) -> list:
    with LogReader(daemon.state / "log.db") as r:
        return [(e.seq, e.event()) for e in r.iter()]


def _raw(daemon: Daemon, data: bytes) -> list[dict]:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(daemon.socket))
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    return [json.loads(line) for line in buf.splitlines()]


def test_idle_daemon_answers_status_on_a_group_only_socket(daemon):
    daemon.start()
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o660
    st = daemon.status()
    assert st["ok"] and st["state"] == "idle" and st["window"] is None
    rec = [r for r in daemon.records() if r.get("event") == "control command"]
    assert rec[-1]["cmd"] == "status" and rec[-1]["uid"] == os.getuid() and rec[-1]["pid"] > 0


def test_status_json_prints_the_daemons_reply_as_one_json_object(daemon):
    daemon.start()
    p = daemon.cli("status", "--json")
    assert p.returncode == 0 and p.stdout.count("\n") == 1, p.stderr
    printed = json.loads(p.stdout)
    assert printed["ok"] and printed["state"] == "idle" and set(printed) == set(daemon.status())


def test_malformed_unknown_and_oversized_commands_get_error_replies_and_change_nothing(daemon):
    daemon.start()
    head = daemon.status()["log"]["head_seq"]
    replies = _raw(daemon, b'not json\n{"cmd": "launch_missiles"}\n{"cmd": "start", "plan": 3}\n{"cmd": "status"}\n')
    assert [r["ok"] for r in replies] == [False, False, False, True]
    assert all("bad command" in r["error"] for r in replies[:3])
    from flare_diag.daemon.service.control import MAX_LINE
    too_long = _raw(daemon, b'{"cmd": "status", "x": "' + b"a" * (MAX_LINE + 10) + b'"}\n')
    assert too_long == [{"ok": False, "error": f"command line longer than {MAX_LINE} bytes"}]
    st = daemon.status()
    assert st["state"] == "idle" and st["log"]["head_seq"] == head


def test_start_with_a_bad_plan_is_refused_with_exit_2_and_starts_nothing(daemon, sim, tmp_path):
    daemon.start()
    bad = tmp_path / "bad.toml"
    bad.write_text(PLAN.read_text().replace("stop_min = 70", "stop_min = 95"))
    p = daemon.cli("start", str(bad), "--site", sim.site.stem)
    assert p.returncode == 2 and "stop_min" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert daemon.status()["state"] == "idle"
    assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-incumbent"


def test_start_of_a_plan_whose_fixture_lies_beside_it_where_the_daemon_does_not_read_is_one_line_exit_2(daemon, sim, tmp_path):
    import shutil
    daemon.start()
    home = tmp_path / "home" / "alice" / "plans"  # a folder the daemon never reads (ProtectHome under systemd)
    shutil.copytree(ROOT / "fixtures" / "data" / "tok1024", home / "alice-fx")
    plan = home / "plan.toml"
    plan.write_text(PLAN.read_text().replace('name = "tok1024"', 'name = "alice-fx"').replace('"tok1024"', '"alice-fx"'))
    daemon.review(plan)  # reviewed first: what follows must log nothing
    head = daemon.status()["log"]["head_seq"]
    p = daemon.cli("start", str(plan), "--site", sim.site.stem)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "alice-fx" in p.stderr and str(home / "alice-fx") in p.stderr and "does not read" in p.stderr
    st = daemon.status()
    assert st["state"] == "idle" and st["log"]["head_seq"] == head  # nothing started, nothing logged
    assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-incumbent"


def test_start_with_a_site_path_is_one_line_saying_where_the_daemon_reads_profiles_exit_2(daemon, tmp_path):
    daemon.start()
    p = daemon.cli("start", str(PLAN), "--site", str(tmp_path / "home" / "alice" / "site.toml"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "not a path" in p.stderr and f"reads profiles only from {daemon.sites}" in p.stderr
    assert daemon.status()["state"] == "idle"


def test_cli_drives_start_status_watch_abort_and_the_window_restores(daemon, sim):
    daemon.start()
    wid = _start(daemon, sim)
    st = daemon.wait_for(in_phase, what="a phase with requests")
    assert st["state"] == "running" and st["window"]["window_id"] == wid
    busy = daemon.cli("start", str(PLAN), "--site", sim.site.stem)
    assert busy.returncode == 4 and "busy" in busy.stderr  # one window at a time: not bad input, try later
    p = daemon.cli("abort", "--reason", "operator test")
    assert p.returncode == 0, p.stderr
    w = daemon.cli("watch", timeout=120)
    assert w.returncode == 1 and "window closed: aborted" in w.stdout
    r = _report(daemon, wid)
    assert r["outcome"] == "aborted" and r["abort"]["reason"] == "operator"
    assert r["restoration"]["verified"] and r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]
    evs = _events(daemon)
    cmds = [ev for _s, ev in evs if type(ev).__name__ == "ControlCommand"]
    assert [c.cmd for c in cmds] == ["start", "abort"] and all(c.uid == os.getuid() and c.pid > 0 for c in cmds)
    abort_seq = next(s for s, ev in evs if type(ev).__name__ == "AbortDecided")
    assert not [ev for s, ev in evs if s > abort_seq and type(ev).__name__ == "ActionRequested" and ev.experimental]
    assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-incumbent"


def test_watch_with_no_window_ever_run_ends_at_once_and_says_so(daemon):
    daemon.start()
    w = daemon.cli("watch", timeout=60)
    assert (w.returncode, w.stdout.strip()) == (0, "no window is running, and none has run on this daemon"), w.stderr


def test_watch_json_with_no_window_keeps_stdout_for_json_and_says_so_on_stderr(daemon):
    daemon.start()
    w = daemon.cli("watch", "--json", timeout=60)
    assert (w.returncode, w.stdout) == (0, ""), w.stdout
    assert "no window is running" in w.stderr


def test_watch_from_past_the_last_windows_close_ends_with_that_windows_exit_code(daemon, sim):
    daemon.start()
    wid = _start(daemon, sim)
    daemon.wait_for(in_phase, what="a phase with requests")
    assert daemon.cli("abort", "--reason", "operator test").returncode == 0
    daemon.wait_for(lambda st: st["state"] == "idle" and st["last_window"], timeout=120, what="the restore")
    head = max(s for s, _ev in _events(daemon))
    w = daemon.cli("watch", "--from-seq", str(head + 1), timeout=60)
    assert w.returncode == 1 and f"the last, {wid}, closed aborted" in w.stdout, w.stdout + w.stderr


def test_two_starts_sent_at_once_open_one_window_and_the_other_is_told_busy(daemon, sim):
    import threading
    daemon.start()
    daemon.review(PLAN)
    cmd = json.dumps({"cmd": "start", "plan_toml": PLAN.read_text(), "site": sim.site.stem, "plan_label": str(PLAN),
                      "time_scale": SCALE, "accept_partial": True}).encode() + b"\n"
    go, replies = threading.Barrier(2), []

    def operator() -> None:
        go.wait()
        replies.extend(_raw(daemon, cmd))

    threads = [threading.Thread(target=operator) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    daemon.wait_for(in_phase, what="a phase with requests")
    assert daemon.cli("abort", "--reason", "operator test").returncode == 0
    daemon.wait_for(lambda st: st["state"] == "idle" and st["last_window"], timeout=120, what="the restore")
    started = [r for r in replies if r["ok"]]
    refused = [r for r in replies if not r["ok"]]
    assert len(started) == 1 and len(refused) == 1 and refused[0]["code"] == "busy", replies
    with LogReader(daemon.state / "log.db") as r:
        opened = [e for e in r.iter() if e.type == "window_opened"]
    assert [e.window_id for e in opened] == [started[0]["window_id"]]
    assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-incumbent"


def test_watch_with_json_prints_every_event_of_the_window_as_a_json_line_until_it_closes(daemon, sim):
    daemon.start()
    wid = _start(daemon, sim)
    daemon.wait_for(in_phase, what="a phase with requests")
    assert daemon.cli("abort", "--reason", "operator test").returncode == 0
    # from the log's first event: the whole window even when its restore ends before the watch connects
    w = daemon.cli("watch", "--json", "--from-seq", "1", timeout=120)
    assert w.returncode == 1, w.stderr
    lines = [json.loads(line) for line in w.stdout.splitlines()]  # nothing but JSON on stdout
    assert {x["window_id"] for x in lines} <= {wid, ""}  # the window's events, and the daemon's own
    assert [x["seq"] for x in lines] == sorted(x["seq"] for x in lines)
    ours = [x for x in lines if x["window_id"] == wid]
    first = next(x for x in ours if x["type"] != "control_command")  # who started it is logged first
    # a production plan's window begins with its preconditions (the offline harness), then opens
    assert first["type"] == "harness_rehearsed" and lines[-1]["type"] == "window_closed"
    assert "window_opened" in [x["type"] for x in lines]
    assert lines[-1]["progress"]["outcome"] == "aborted" and "window closed: aborted" in lines[-1]["text"]
    started = next(x for x in lines if x["type"] == "phase_started" and x["event"]["phase"] == "A.forward_prime")
    assert started["progress"]["phase_total"] == 52 and started["progress"]["phase_requests"] == 0


def test_status_shows_the_phases_requests_done_of_total_and_its_estimated_end(daemon, sim):
    import re
    daemon.start()
    _start(daemon, sim)
    st = daemon.wait_for(in_phase, what="a phase with requests")
    assert st["window"]["phase_total"] == 52 and st["window"]["phase_estimated_end_minute"] is not None
    p = daemon.cli("status")
    assert p.returncode == 0 and re.search(r"phase A\.\w+ \(\d+/52 requests\)", p.stdout), p.stdout
    # its start's estimate, or from its second request on the pace it has kept
    assert re.search(r"phase (estimated to end|ends) at minute [\d.]+( by its pace so far)?", p.stdout), p.stdout
    daemon.cli("abort", "--reason", "test over")


def test_the_daemon_archives_its_own_log_only_between_windows_and_both_logs_verify(tmp_path, sim, capsys):
    import time
    from flare_diag.daemon.cli.commands import main as cli_main
    # an operator who lets the socket archive everything up to today
    daemon = Daemon(tmp_path, args=("--archive-keep-days", "0"))
    try:
        _archives_between_windows(daemon, sim, capsys, cli_main, time)
    finally:
        daemon.stop()


def test_a_socket_archive_that_would_take_the_recent_days_is_refused(daemon):
    import time
    daemon.start()
    tomorrow = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 86400))
    p = daemon.cli("log", "archive", "--before", tomorrow)
    assert p.returncode == 2 and "keeps the last 30 days" in p.stderr and p.stderr.count("\n") == 1


def _archives_between_windows(daemon, sim, capsys, cli_main, time) -> None:
    daemon.start()
    wid = _start(daemon, sim)
    daemon.wait_for(in_phase, what="a phase with requests")
    tomorrow = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 86400))
    busy = daemon.cli("log", "archive", "--before", tomorrow)
    assert busy.returncode == 4 and "between windows" in busy.stderr
    assert daemon.cli("abort", "--reason", "test over").returncode == 0
    assert daemon.cli("watch", timeout=120).returncode == 1
    p = daemon.cli("log", "archive", "--before", tomorrow, "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    archive = Path(rep["archive"])
    assert rep["windows"] == [wid] and archive.parent == daemon.state / "archive"
    assert cli_main(["log", "verify", str(archive)]) == 0 and cli_main(["log", "verify", str(daemon.state / "log.db")]) == 0
    assert cli_main(["report", str(archive), "--window", wid, "--format", "json"]) == 0
    capsys.readouterr()
    daemon.kill(signal.SIGTERM)
    daemon.start()  # its start-up check verifies the log from the archived base
    assert daemon.status()["state"] == "idle"
    wid2 = _start(daemon, sim)  # the live chain goes on from the archived prefix
    assert daemon.cli("abort", "--reason", "test over").returncode == 0
    assert daemon.cli("watch", timeout=120).returncode == 1
    assert cli_main(["log", "verify", str(daemon.state / "log.db")]) == 0
    assert daemon.cli("report", wid2, "--format", "json").returncode == 0


def test_no_token_reaches_the_log_the_reports_or_the_service_log(daemon, sim):
    daemon.start()
    wid = _start(daemon, sim)
    daemon.wait_for(in_phase, what="a phase with requests")
    daemon.cli("abort", "--reason", "enough")
    daemon.wait_for(lambda s: s["state"] == "idle", timeout=120, what="the restore")
    reports = [daemon.cli("report", wid, "--format", f).stdout for f in ("json", "md", "html")]
    files = [p for p in daemon.state.rglob("*") if p.is_file()] + [daemon.log_path]
    assert files and all(sim.token.encode() not in p.read_bytes() for p in files)
    assert all(sim.token not in r for r in reports)


def test_every_decision_names_the_input_that_caused_it(daemon, sim):
    from flare_diag.events.schema import Decision, Input
    daemon.start()
    _start(daemon, sim)
    daemon.wait_for(in_phase, what="a phase with requests")
    daemon.cli("abort", "--reason", "enough")
    daemon.wait_for(lambda s: s["state"] == "idle", timeout=120, what="the restore")
    with LogReader(daemon.state / "log.db") as r:
        envs = list(r.iter())
    by_seq = {e.seq: e.event() for e in envs}
    decisions = [e for e in envs if isinstance(by_seq[e.seq], Decision)]
    assert decisions and all(isinstance(by_seq.get(e.causation_seq), Input) and e.causation_seq < e.seq
                             for e in decisions)


def test_sigkill_mid_window_then_restart_restores_the_incumbent(daemon, sim):
    daemon.start()
    wid = _start(daemon, sim)
    daemon.wait_for(in_phase, what="a phase with requests")
    assert sim.get("/manager/v1/state")["loaded"]["recipe"] != "glm-incumbent"
    daemon.kill(signal.SIGKILL)
    daemon.start()
    st = daemon.wait_for(lambda s: s["state"] == "idle" and s["last_window"], timeout=120, what="the restore")
    assert st["last_window"]["window_id"] == wid and st["last_window"]["outcome"] == "aborted"
    r = _report(daemon, wid)
    assert r["abort"]["reason"] == "daemon_restart"
    assert r["restoration"]["verified"] and r["restoration"]["incumbent_sha256_match"]
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]
    assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-incumbent"
    assert any(r.get("event") == "resuming an unfinished window in its restore path" for r in daemon.records())
    snaps = list((daemon.state / "reports" / wid).iterdir())
    assert len(snaps) == 1 and (snaps[0] / "report.json").is_file()


def test_a_window_that_cannot_be_resumed_blocks_new_windows_and_says_which(daemon, sim):
    daemon.start()
    wid = _start(daemon, sim)
    daemon.wait_for(in_phase, what="a phase with requests")
    daemon.kill(signal.SIGKILL)
    token = sim.site.parent / "sim.token"
    token.rename(token.with_suffix(".gone"))  # the profile's token file is gone: nothing can be restored with it
    daemon.start()
    notes = [ev for _s, ev in _events(daemon) if type(ev).__name__ == "LogNote"]
    assert notes and wid in notes[-1].text and "cannot resume" in notes[-1].text and "token_file" in notes[-1].text
    st = daemon.status()  # not `idle`: the host may still be taken apart
    assert st["state"] == "needs_attention" and st["needs_attention"]["window_id"] == wid
    assert "cannot be resumed" in st["needs_attention"]["needs"]
    token.with_suffix(".gone").rename(token)
    p = daemon.cli("start", str(PLAN), "--site", sim.site.stem)
    assert p.returncode == 2 and wid in p.stderr and "unfinished" in p.stderr
    # a stop with nothing able to restore it says so and does not exit as if all were well
    assert daemon.kill(signal.SIGTERM) == 1
    assert any(r.get("event") == "stopping with a window unfinished: the host may still be taken apart"
               for r in daemon.records())


def test_a_resume_with_a_changed_site_profile_restores_with_the_recorded_one_and_says_why(daemon, sim):
    daemon.start()
    wid = _start(daemon, sim)
    daemon.wait_for(in_phase, what="a phase with requests")
    daemon.kill(signal.SIGKILL)
    # every service moved to a port where nothing listens: a recovery that re-read the file would fail to restore
    sim.site.write_text(sim.site.read_text().replace(sim.url, "http://127.0.0.1:9"))
    daemon.start()
    st = daemon.wait_for(lambda s: s["state"] == "idle" and s["last_window"], timeout=120, what="the restore")
    assert st["last_window"]["window_id"] == wid
    r = _report(daemon, wid)
    assert r["abort"]["reason"] == "daemon_restart" and r["restoration"]["verified"]
    mism = [a for a in r["alarms"] if a["kind"] == "resume_mismatch"]
    assert len(mism) == 1 and "site profile" in mism[0]["detail"] and "changed since the window opened" in mism[0]["detail"]
    restarted = [ev for _s, ev in _events(daemon) if type(ev).__name__ == "DaemonRestarted"]
    assert restarted and any("site profile" in m for m in restarted[-1].mismatches)
    assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-incumbent"


def test_sigterm_inside_a_window_restores_before_the_daemon_exits(daemon, sim):
    daemon.start()
    wid = _start(daemon, sim)
    daemon.wait_for(in_phase, what="a phase with requests")
    # the signal goes to the main thread, whose loop restores: no worker thread can take it and have
    # its wait (a commit, a file read) interrupted for a handler only the main thread runs
    assert threads_taking(daemon.proc.pid, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}) == []
    assert daemon.kill(signal.SIGTERM) == 0
    evs = _events(daemon)
    closed = [ev for _s, ev in evs if type(ev).__name__ == "WindowClosed"]
    assert [c.outcome for c in closed] == ["aborted"]
    rest = [ev for _s, ev in evs if type(ev).__name__ == "RestorationRecorded"]
    assert rest and rest[-1].verified
    assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-incumbent"
    assert not daemon.socket.exists()
    daemon.start()  # nothing left to recover; status still tells of the window that closed
    st = daemon.status()
    assert st["state"] == "idle" and st["last_window"]["window_id"] == wid
    assert st["last_window"]["outcome"] == "aborted"


class NotifyReader(SocketThread):
    """The receiving end of $NOTIFY_SOCKET, read continuously as systemd reads it."""

    def __init__(self, path: Path) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(path))
        sock.settimeout(0.2)
        self.messages: list[str] = []
        super().__init__(sock)

    def take(self) -> None:
        self.messages.append(self.sock.recv(4096).decode())

    def statuses(self) -> list[str]:
        return [line[7:] for m in list(self.messages) for line in m.splitlines() if line.startswith("STATUS=")]


def test_a_restore_that_does_not_verify_leaves_the_primary_out_and_the_daemon_says_so(sim, tmp_path):
    import httpx

    n = 3  # the site does not opt in to pace probing: the window's own third request
    for f in ({"kind": "auth", "at": {"request": n}}, {"kind": "load_failure", "at": {"request": n}}):
        httpx.post(f"{sim.url}/sim/v1/faults", json=f, headers={"Authorization": f"Bearer {sim.token}"}).raise_for_status()
    notify = NotifyReader(tmp_path / "notify.sock")
    d = Daemon(tmp_path, env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    try:
        d.start()
        wid = _start(d, sim)
        st = d.wait_for(lambda s: s["state"] == "idle" and s["last_window"], timeout=120, what="the window to close")
        table = d.cli("status")
    finally:
        d.stop()
        notify.close()
    last = st["last_window"]
    assert last["window_id"] == wid and last["outcome"] == "restore_failed"
    assert "incumbent_sha256_match" in last["restoration_failed"]
    assert [a["kind"] for a in last["alarms"]] == ["primary_left_quiesced"]
    assert "not verified" in table.stdout and "primary_left_quiesced" in table.stdout
    assert notify.statuses()[-1].startswith(f"idle; NEEDS ATTENTION: window {wid} restore_failed")
    assert any(r.get("level") == "error" and r.get("window_id") == wid for r in d.records())
    assert sim.get("/routed/router/v1/backends")["backends"][0]["admitted"] is False  # still quiesced


def test_status_notifications_are_a_refreshed_line_not_one_per_committed_event(sim, tmp_path):
    notify = NotifyReader(tmp_path / "notify.sock")
    d = Daemon(tmp_path, env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    try:
        d.start()
        wid = _start(d, sim)
        d.wait_for(lambda s: (s.get("window") or {}).get("requests", 0) >= 20, timeout=120, what="20 requests")
        d.cli("abort", "--reason", "test")
        d.wait_for(lambda s: s["state"] == "idle" and s["last_window"], timeout=120, what="the restore")
    finally:
        d.stop()
        notify.close()
    events = len(_events(d))
    running = [x for x in notify.statuses() if x.startswith(f"window {wid}")]
    assert running and len(running) * 5 < events  # a datagram per commit would fill systemd's queue
    assert notify.statuses()[-1] == "idle"


def test_systemd_notify_gets_ready_status_and_watchdog_pings(tmp_path):
    ns = tmp_path / "notify.sock"
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(str(ns))
    rx.settimeout(20)
    d = Daemon(tmp_path, env={"NOTIFY_SOCKET": str(ns), "WATCHDOG_USEC": "200000"})
    try:
        d.start()
        msgs = []
        while not any("WATCHDOG=1" in m for m in msgs) or not any("READY=1" in m for m in msgs):
            msgs.append(rx.recv(4096).decode())
        ready = next(m for m in msgs if "READY=1" in m)
        assert "STATUS=idle" in ready
        d.kill(signal.SIGTERM)
        msgs = []
        while not any("STOPPING=1" in m for m in msgs):
            msgs.append(rx.recv(4096).decode())
    finally:
        d.stop()
        rx.close()


def test_without_flags_the_service_uses_systemds_runtime_and_state_directories(monkeypatch, tmp_path):
    from flare_diag.daemon.service.paths import default_socket, default_state_dir
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path / "run"))
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path / 'state'}:{tmp_path / 'other'}")
    assert default_socket() == tmp_path / "run" / "control.sock"
    assert default_state_dir() == tmp_path / "state"


def test_two_thousand_idle_control_connections_delay_neither_status_nor_the_restore(tmp_path, sim):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 4096)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < 2100:
        pytest.skip(f"this machine allows {hard} open files; the test needs 2100")
    # the daemon gets 1024 files, as under `prlimit --nofile=1024`: unbounded, 2000 connections would exhaust them
    daemon = Daemon(tmp_path, max_files=1024).start()
    try:
        _two_thousand_idle(daemon, sim)
    finally:
        daemon.stop()


def _two_thousand_idle(daemon: Daemon, sim: Sim) -> None:
    wid = _start(daemon, sim)
    daemon.wait_for(in_phase, what="a phase with requests")
    idle = []
    try:
        for _ in range(2000):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(str(daemon.socket))
            idle.append(s)
        st = daemon.status()  # answered at once: an idle connection made room for it
        assert st["state"] == "running" and st["window"]["window_id"] == wid
        assert daemon.cli("abort", "--reason", "enough").returncode == 0
        daemon.wait_for(lambda s: s["state"] == "idle", timeout=120, what="the restore")
    finally:
        for s in idle:
            s.close()
    assert _report(daemon, wid)["restoration"]["verified"]
    assert sim.get("/manager/v1/state")["loaded"]["recipe"] == "glm-incumbent"
    assert daemon.proc.poll() is None


def test_sigterm_with_watchers_connected_stops_cleanly(daemon):
    daemon.start()
    watchers = []
    for _ in range(3):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(str(daemon.socket))
        s.sendall(b'{"cmd": "watch"}\n')
        assert json.loads(s.makefile("rb").readline())["watching"]
        watchers.append(s)
    try:
        assert daemon.kill(signal.SIGTERM) == 0
    finally:
        for s in watchers:
            s.close()
    text = daemon.log_path.read_text()
    assert "Traceback" not in text and "CancelledError" not in text


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(url, timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_daemons_metrics_follow_a_window_from_idle_through_its_phases_to_its_abort(sim, tmp_path):
    d = Daemon(tmp_path, args=("--metrics-address", "127.0.0.1:0"))
    try:
        d.start()
        addr = next(r["address"] for r in d.records() if r.get("event") == "metrics serving")
        url = f"http://{addr}/metrics"
        idle = _scrape(url)
        assert idle[("flare_diag_state", (("state", "idle"),))] == 1 and idle[("flare_diag_window_running", ())] == 0
        # every gauge from start-up, with NaN where there is nothing to say yet
        assert math.isnan(idle[("flare_diag_last_restoration_verified", ())])
        assert math.isnan(idle[("flare_diag_window_elapsed_seconds", ())]) and idle[("flare_diag_window_requests", ())] == 0
        wid = _start(d, sim)
        d.wait_for(lambda s: in_phase(s), what="a replay phase")
        running = _scrape(url)
        assert running[("flare_diag_window_running", ())] == 1 and running[("flare_diag_window_elapsed_seconds", ())] > 0
        assert running[("flare_diag_window_stage", (("stage", "experiment"),))] == 1
        assert [k for k in running if k[0] == "flare_diag_window_phase" and dict(k[1])["window_id"] == wid]
        d.cli("abort", "--reason", "metrics test")
        d.wait_for(lambda s: s["state"] == "idle" and s["last_window"], timeout=120, what="the restore")
        after = _scrape(url)
        listed = d.cli("windows", "--json")  # the daemon's own log, found through its socket
    finally:
        d.stop()
    assert listed.returncode == 0, listed.stderr
    row = json.loads(listed.stdout.splitlines()[-1])
    assert row["window_id"] == wid and row["outcome"] == "aborted" and row["restoration_verified"] is True
    assert after[("flare_diag_window_running", ())] == 0
    assert after[("flare_diag_aborts_total", (("reason", "operator"),))] == 1
    assert after[("flare_diag_last_outcome", (("outcome", "aborted"),))] == 1
    assert after[("flare_diag_last_restoration_verified", ())] == 1
    assert after[("flare_diag_primary_left_quiesced", ())] == 0


def test_a_bad_metrics_address_is_one_line_and_exit_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon", "--socket", str(tmp_path / "s"), "--state-dir", str(tmp_path / "st"),
                        "--metrics-address", "nowhere"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "HOST:PORT" in p.stderr


class _Reader:
    """A `watch` stream that keeps reading (never idle), on a thread of its own."""

    def __init__(self, daemon: Daemon) -> None:
        import threading
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(10)
        self.sock.connect(str(daemon.socket))
        self.sock.sendall(b'{"cmd": "watch"}\n')
        self.first = b""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return
                self.first = self.first or chunk
        except OSError:
            return

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


@pytest.mark.parametrize("streams", [64, 1000])
def test_reading_watch_streams_never_starve_abort_or_status(tmp_path, sim, streams):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < streams + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    daemon = Daemon(tmp_path, max_files=4096).start()
    readers = []
    try:
        wid = _start(daemon, sim)
        daemon.wait_for(in_phase, what="a phase with requests")
        readers = [_Reader(daemon) for _ in range(streams)]
        st = daemon.status()
        assert st["state"] == "running" and st["window"]["window_id"] == wid
        p = daemon.cli("abort", "--reason", "watchers everywhere")
        assert p.returncode == 0, p.stderr
        st = daemon.wait_for(lambda s: s["state"] == "idle", timeout=120, what="the restore")
    finally:
        for r in readers:
            r.close()
        daemon.stop()
    rep = _report_from(daemon, wid)
    assert rep["abort"]["reason"] == "operator" and rep["restoration"]["verified"]
    # the abort took effect within a second of window time of its command
    assert rep["restoration"]["started_minute"] - rep["abort"]["minute"] <= 1 / 60
    refused = [r for r in readers if b"too many watch streams" in r.first]
    assert refused and len(readers) - len(refused) <= 32


def _report_from(daemon: Daemon, wid: str) -> dict:
    from flare_diag.daemon.reports.publish import build_report
    return build_report(daemon.state / "log.db", wid)


def test_a_connection_flood_at_64_open_files_leaves_the_daemon_up_and_the_window_restored(tmp_path, sim):
    daemon = Daemon(tmp_path, max_files=64).start()
    flood = []
    try:
        wid = _start(daemon, sim)
        daemon.wait_for(in_phase, what="a phase with requests")
        for _ in range(200):
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            try:
                s.connect(str(daemon.socket))
            except (BlockingIOError, OSError):
                pass
            flood.append(s)
        st = daemon.status()  # answered while the flood holds its connections
        assert st["state"] in ("running", "needs_attention") and st["window"]["window_id"] == wid
        for s in flood:
            s.close()
        flood = []
        assert daemon.proc.poll() is None, daemon.log_path.read_text()[-2000:]
        # the flood may have cost the window its own connections (the host unreachable: it aborts and
        # restores by itself); else the operator's abort does
        daemon.cli("abort", "--reason", "after the flood")
        daemon.wait_for(lambda s: s["state"] == "idle", timeout=120, what="the restore")
        assert daemon.proc.poll() is None
    finally:
        for s in flood:
            s.close()
        daemon.stop()
    rep = _report_from(daemon, wid)
    # the control connections took only what the limit leaves beyond the window's own descriptors, so
    # the window kept its connections to the host and restored it
    assert rep["restoration"]["verified"], (rep["abort"], rep["restoration"], rep["alarms"])
    assert "Traceback" not in daemon.log_path.read_text()
    # the journal says what happened: the slots filled, and freed again
    events = [r.get("event") for r in daemon.records()]
    assert any(e and e.startswith("control connections at capacity") for e in events)
    assert "control connections below capacity again" in events


def test_at_44_open_files_with_a_window_running_abort_and_status_get_through_and_the_window_restores(tmp_path, sim):
    """`ulimit -n 44` (soft and hard): the window's own descriptors come first, and the control socket
    still answers the operator's status and abort; the restore verifies."""
    daemon = Daemon(tmp_path, max_files=44).start()
    try:
        wid = _start(daemon, sim)
        daemon.wait_for(in_phase, what="a phase with requests")
        assert daemon.status()["window"]["window_id"] == wid
        p = daemon.cli("abort", "--reason", "at 44 open files")
        assert p.returncode == 0, p.stderr
        daemon.wait_for(lambda s: s["state"] == "idle", timeout=180, what="the restore")
        assert daemon.proc.poll() is None
    finally:
        daemon.stop()
    rep = _report_from(daemon, wid)
    assert rep["outcome"] == "aborted" and rep["abort"]["reason"] == "operator", rep["abort"]
    assert rep["restoration"]["verified"], (rep["restoration"], rep["alarms"])
    assert "Traceback" not in daemon.log_path.read_text()


def test_metrics_bind_beyond_loopback_only_with_the_explicit_flag(tmp_path):
    base = [sys.executable, "-m", "flare_diag.daemon", "--socket", str(tmp_path / "c.sock"), "--state-dir", str(tmp_path / "st"),
            "--sites-dir", str(tmp_path)]
    p = subprocess.run([*base, "--metrics-address", "0.0.0.0:0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "not a loopback address" in p.stderr and p.stderr.count("\n") == 1
    assert not (tmp_path / "st").exists()  # nothing started


def test_the_journal_gets_an_abort_at_priority_err_and_routine_lines_at_info(daemon, sim):
    daemon.start()
    wid = _start(daemon, sim)
    daemon.wait_for(in_phase, what="a phase with requests")
    assert daemon.cli("abort", "--reason", "priorities").returncode == 0
    daemon.wait_for(lambda s: s["state"] == "idle", timeout=120, what="the restore")
    recs = daemon.records()
    aborted = [r for r in recs if r.get("event") == "window aborted and restored"]
    assert aborted and aborted[0]["priority"] == 3 and aborted[0]["window_id"] == wid and aborted[0]["reason"] == "operator"
    assert next(r for r in recs if r.get("event") == "ready")["priority"] == 6
    assert all(r.get("priority") is not None for r in recs if "raw" not in r)  # every JSON line carries one


def test_status_after_a_window_restored_says_its_restoration_verified(daemon, sim):
    daemon.start()
    _start(daemon, sim)
    daemon.wait_for(in_phase, what="a phase with requests")
    assert daemon.cli("abort", "--reason", "operator test").returncode == 0
    st = daemon.wait_for(lambda s: s["state"] == "idle", timeout=120, what="the restore")
    assert st["last_window"]["restoration_verified"] is True and st["last_window"]["host_changed"] is True
    p = daemon.cli("status")
    row = next(line for line in p.stdout.splitlines() if "restoration" in line)
    assert "verified" in row and "not verified" not in row, p.stdout


def test_the_daemons_forecast_probe_logs_each_request_before_it_goes_out_and_its_answer_after(daemon, sim):
    from flare_diag.events.reader import LogReader
    with open(sim.site, "a") as f:  # the site opts in to pace probing (the plan allows four)
        f.write("[forecast]\nprobe_requests = 2\n")
    daemon.start()
    _start(daemon, sim)
    daemon.cli("abort", "--reason", "the probe was the subject")
    daemon.wait_for(lambda s: s["state"] == "idle" and s["last_window"], timeout=120, what="the restore")
    with LogReader(daemon.state / "log.db") as reader:
        trail = [(type(ev).__name__, ev.body_index, e.window_id) for e in reader.iter()
                 for ev in [e.event()] if type(ev).__name__ in ("ProbeSent", "ProbeRequest")]
    assert [k for k, _i, _w in trail] == ["ProbeSent", "ProbeRequest"] * 2
    assert trail[0][1] == trail[1][1] and all(w == "" for _k, _i, w in trail)  # sent outside any window
