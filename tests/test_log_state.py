"""`flare-diag log state`: a window's decider state as a value, replayed from its log by this build."""

from __future__ import annotations

import json
import re

import msgspec
import pytest

from flare_diag.daemon.cli.commands import main
from flare_diag.events.actions import SendRequest
from flare_diag.events.reader import LogReader
from flare_diag.events.schema import Input, window_minute
from flare_diag.policies.audit import StateAt, WindowReplay, state_at
from tests.test_fault_matrix import rehearse
from tests.test_replay_corpus import EXPECTED, _log


def _records(db, wid=None):
    with LogReader(db) as r:
        return [(e.seq, e.window_id, e.event()) for e in r.iter(window_id=wid)]


def _only_window(db) -> str:
    with LogReader(db) as r:
        (wid,) = r.window_ids()
    return wid


def _report(db, capsys) -> dict:
    capsys.readouterr()
    assert main(["report", str(db), "--format", "json"]) in (0, 1)
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_state_after_a_whole_log_holds_the_cells_and_abort_its_report_projects(tmp_path, capsys, name):
    # the decider's state and the report are computed apart (a replay of the inputs; a fold of the
    # recorded decisions): a window whose two disagree was not decided as its report says
    db = _log(tmp_path, name)
    wid = _only_window(db)
    at = state_at(_records(db), wid)
    report = _report(db, capsys)
    assert at.divergence is None
    assert at.state.stage == "closed"
    assert {p: c.status for p, c in at.state.cells.items()} == {c["phase"]: c["status"] for c in report["cells"]}
    assert (at.state.abort.reason if at.state.abort else None) == (report["abort"] or {}).get("reason")


def test_two_replays_of_a_log_hold_equal_states_at_every_input(tmp_path):
    db = _log(tmp_path, "restore-path")
    wid = _only_window(db)
    records = _records(db)
    inputs = [seq for seq, _w, ev in records if ev.__struct_config__.tag not in ("cell_recorded", "action_requested")]
    for seq in inputs[:: max(1, len(inputs) // 40)]:
        first, second = state_at(records, wid, seq), state_at(iter(records), wid, seq)
        assert first == second
        assert msgspec.json.encode(first) == msgspec.json.encode(second)


def test_a_state_decodes_back_to_an_equal_value(tmp_path):
    db = _log(tmp_path, "identity-drift-tp")
    at = state_at(_records(db), _only_window(db))
    assert msgspec.json.decode(msgspec.json.encode(at), type=StateAt) == at


def test_the_state_mid_phase_names_the_running_phase_and_the_actions_it_waits_for(tmp_path, capsys):
    db = _log(tmp_path, "completed-default")
    records = _records(db)
    # the input that had A.forward_prime's middle request sent: the state after it waits for that request
    sends = [seq for seq, _w, ev in records if ev.__struct_config__.tag == "action_requested"
             and isinstance(ev.request, SendRequest) and ev.request.phase == "A.forward_prime"]
    with LogReader(db) as r:
        mid = next(e.causation_seq for e in r.iter(from_seq=sends[len(sends) // 2]))
    capsys.readouterr()
    assert main(["log", "state", str(db), "--at", str(mid)]) == 0
    out = capsys.readouterr().out
    assert "stage experiment, minute " in out
    assert "running phase A.forward_prime: " in out
    assert "outstanding: #" in out and "send_request (experimental)" in out
    assert "restore: not begun" in out


def test_the_state_of_an_aborted_window_names_the_abort_and_the_restore(tmp_path, capsys):
    db = _log(tmp_path, "identity-drift-tp")
    capsys.readouterr()
    assert main(["log", "state", str(db)]) == 0
    out = capsys.readouterr().out
    assert "abort: identity_drift at minute " in out
    assert "restore: begun (abort) at minute " in out and "readmit sent: yes" in out


def test_the_state_as_json_is_one_object_with_the_snapshot(tmp_path, capsys):
    db = _log(tmp_path, "prime-invalid")
    capsys.readouterr()
    assert main(["log", "state", str(db), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["state"]["stage"] == "closed" and doc["seq"] > 0 and doc["divergence"] is None


@pytest.mark.parametrize(("args", "expected"), [
    (["--window", "no-such-window"], "no window 'no-such-window' in this log"),
    (["--at", "0"], "--at: 0: expected [1,"),
    (["--at", "x"], "--at: 'x': expected a whole number"),
])
def test_a_wrong_window_or_seq_is_refused_in_one_line(tmp_path, capsys, args, expected):
    db = _log(tmp_path, "restore-path")
    capsys.readouterr()
    try:
        code = main(["log", "state", str(db), *args])
    except SystemExit as exc:  # argparse's refusal
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err and len(err.strip().splitlines()) == 1


def test_a_file_that_is_not_a_log_is_refused_naming_it(tmp_path, capsys):
    bad = tmp_path / "notes.db"
    bad.write_bytes(b"not sqlite at all" * 100)
    capsys.readouterr()
    assert main(["log", "state", str(bad)]) == 2
    assert "notes.db: not a flare-diag event log" in capsys.readouterr().err


def test_an_input_the_decider_cannot_take_ends_the_replay_and_says_where():
    from tests.policy_world import opened_input
    forged = opened_input({"name": "not a plan"}, window_id="w-forged")
    at = state_at([(1, "w-forged", forged)], "w-forged")
    assert at.refused.startswith("seq 1: the decider cannot take this input (PlanError: ")
    assert at.state.stage == "idle" and at.seq == 0


def test_the_state_at_a_minute_has_every_input_up_to_it_and_none_after(tmp_path):
    db = _log(tmp_path, "completed-default")
    wid = _only_window(db)
    records = _records(db)
    whole = WindowReplay(follow=True)
    for seq, w, ev in records:
        whole.feed(seq, w, ev)
    minutes = [(seq, window_minute(ev.at_ns, whole.policy.state.t0)) for seq, _w, ev in records if isinstance(ev, Input)]
    at = state_at(records, wid, upto_minute=1.0)
    fed = [m for seq, m in minutes if seq <= at.seq]
    left = [m for seq, m in minutes if seq > at.seq]
    assert fed and left
    assert all(m is None or m <= 1.0 for m in fed) and left[0] is not None and left[0] > 1.0
    assert at.state.minute == fed[-1]


def test_a_seq_and_a_minute_together_are_refused(tmp_path, capsys):
    db = _log(tmp_path, "restore-path")
    with pytest.raises(SystemExit) as exc:
        main(["log", "state", str(db), "--at", "5", "--minute", "3"])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_the_state_says_the_figures_behind_the_schedule_and_the_growth_rule(tmp_path, capsys):
    db = _log(tmp_path, "completed-default")
    capsys.readouterr()
    assert main(["log", "state", str(db), "--minute", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"schedule estimate: pace x[\d.]+ of the rate model \+ [\d.]+ s a request \(\d+ rounds learned\)", out), out
    assert re.search(r"growth baseline: [\d.]+ GiB resident; 0 observations over the bound in a row", out), out


def test_the_state_names_the_steps_the_procedure_is_in(tmp_path):
    db = _log(tmp_path, "completed-default")
    wid = _only_window(db)
    records = _records(db)
    mid = state_at(records, wid, upto_minute=1.0).state
    assert mid.procedure[:5] == ("experiment", "run", "run_arm", "run_phase", "replay_phase"), mid.procedure
    assert "act" not in mid.procedure and "act_all" not in mid.procedure  # the driver's own: `waiting` says those
    assert state_at(records, wid).state.procedure == ()  # closed: nothing runs


def test_the_state_after_a_candidate_load_that_got_no_answer_says_no_later_load_is_sent(small_plan, tmp_path, capsys):
    rehearse(small_plan, tmp_path / "out", "--fault", "load_hang@before_load=1")
    capsys.readouterr()
    assert main(["log", "state", str(tmp_path / "out" / "log.db")]) == 0
    out = capsys.readouterr().out
    assert "candidate loads stopped: the candidate's load as incarnation A got no answer within its deadline" in out, out
