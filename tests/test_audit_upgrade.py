"""A log kept across an upgrade of flare-diag: windows decided by an older policy, which this build
decides differently, are named as not replayed (not as forged), and the windows this build decided
still audit and report as ok."""

from __future__ import annotations

import json

import msgspec
import pytest

from flare_diag.daemon.cli.commands import main
from flare_diag.policies import interpret
from tests.logtools import write_window

OLDER = "0" * 64  # the policy digest an older build recorded


@pytest.fixture
async def upgraded_log(tmp_path, monkeypatch):
    """w-old decided by an older build whose churn verdict named its next step in other words; then
    w-new, decided by this build, appended to the same log."""
    db = tmp_path / "log.db"
    with monkeypatch.context() as m:
        m.setitem(interpret.NEXT_EXPERIMENT, "row_checkpoint_churn", "Older words for the same next step.")
        await write_window(db, "w-old", reuse_on={"A.reverse_replay"},
                           opened=lambda ev: msgspec.structs.replace(ev, policy_sha256=OLDER))
    await write_window(db, "w-new", reuse_on={"A.reverse_replay"})
    return db


def test_log_audit_names_the_older_window_not_replayed_and_the_others_matching(upgraded_log, capsys):
    capsys.readouterr()
    assert main(["log", "audit", str(upgraded_log)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert not any("DIVERGED" in line for line in out), out
    assert out[0].startswith("NOT REPLAYED: window w-old was decided by policy 000000000000;")
    assert "next_experiment=" in out[0] and "Older words" in out[0] and len(out[0]) < 600
    assert out[1] == "the other 1 of 2 windows replayed: their decisions match"


def test_log_audit_json_lists_the_window_not_replayed_with_its_recorded_policy(upgraded_log, capsys):
    capsys.readouterr()
    assert main(["log", "audit", str(upgraded_log), "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["divergence"] is None
    assert [(x["window_id"], x["policy_sha256"]) for x in res["not_replayed"]] == [("w-old", OLDER)]


def test_a_report_of_the_window_this_build_decided_is_audit_ok_beside_an_older_one(upgraded_log, capsys):
    capsys.readouterr()
    assert main(["report", str(upgraded_log), "--window", "w-new", "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"] and "audit_policy" not in r["integrity"]


def test_a_report_of_the_older_window_is_written_and_says_first_that_its_decisions_were_not_replayed(upgraded_log, capsys):
    capsys.readouterr()
    assert main(["report", str(upgraded_log), "--window", "w-old", "--format", "md"]) == 1
    captured = capsys.readouterr()
    head = captured.out.splitlines()[:10]
    assert any(line.startswith("> - DECISIONS NOT REPLAYED: window w-old was decided by policy 000000000000") for line in head), head
    assert not any("LOG AUDIT FAILED" in line for line in captured.out.splitlines())
    assert captured.err.count("\n") == 1 and "decisions not audited by this build" in captured.err
    assert "does not verify" not in captured.err


async def test_report_compare_refuses_a_window_not_replayed_and_says_why(upgraded_log, capsys):
    for w in ("w-new-2", "w-base-1", "w-base-2", "w-base-3"):
        await write_window(upgraded_log, w, reuse_on={"A.reverse_replay"})
    capsys.readouterr()
    rc = main(["report", "compare", str(upgraded_log), "--windows", "w-old", "w-new", "w-new-2",
               "--baseline", "w-base-1", "w-base-2", "w-base-3"])
    captured = capsys.readouterr()
    assert rc == 1, captured
    assert "w-old" in captured.out and "another policy version and not audited by this build" in captured.out


def test_a_decision_forged_in_this_builds_window_still_fails_the_report_of_the_older_one(upgraded_log, capsys):
    from tests.logtools import forge

    def reword(row: dict) -> dict:  # the newer window's verdict rewritten, the chain recomputed
        if row["type"] == "verdict_reached" and row["window_id"] == "w-new":
            ev = json.loads(bytes(row["payload"]))
            ev["basis"] = "forged"
            row["payload"] = msgspec.json.encode(ev)
        return row
    forge(upgraded_log, reword)
    capsys.readouterr()
    assert main(["report", str(upgraded_log), "--window", "w-old", "--format", "md"]) == 1
    captured = capsys.readouterr()
    head = captured.out.splitlines()[:12]
    assert any("LOG AUDIT FAILED" in line and "w-new" in line for line in head), head
    assert any("DECISIONS NOT REPLAYED" in line for line in head), head
    assert "does not verify" in captured.err and captured.err.count("\n") == 1
