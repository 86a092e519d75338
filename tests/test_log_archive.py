"""Archiving closed windows out of the live log, and backing a log up while it is in use: every
log involved still verifies on its own, and tampering still shows."""

from __future__ import annotations

import calendar
import json
import sqlite3
import time
from pathlib import Path

import pytest

from flare_diag.daemon.cli.commands import main
from flare_diag.events.reader import LogReader
from flare_diag.events.store import EventStore
from tests.logtools import write_window


def _dated(day: str):
    """A store clock that stands on `day` (UTC) and ticks a microsecond per reading."""
    t = [calendar.timegm(time.strptime(day, "%Y-%m-%d")) * 10**9 + 3600 * 10**9]

    def clock() -> tuple[int, int]:
        t[0] += 1000
        return t[0], t[0]
    return clock


@pytest.fixture
async def three_windows(tmp_path) -> Path:
    db = tmp_path / "log.db"
    for wid, day in (("w-oct-1", "2026-10-01"), ("w-oct-5", "2026-10-05"), ("w-nov-20", "2026-11-20")):
        await write_window(db, window_id=wid, clock=_dated(day))
    return db


def _archive(db: Path, before: str, to: Path, capsys) -> dict:
    capsys.readouterr()
    assert main(["log", "archive", str(db), "--before", before, "--to", str(to), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _verifies(db: Path, capsys) -> bool:
    capsys.readouterr()
    rc = main(["log", "verify", str(db)])
    capsys.readouterr()
    return rc == 0


def test_after_archiving_the_live_log_and_the_archive_both_verify_on_their_own(three_windows, tmp_path, capsys):
    done = _archive(three_windows, "2026-11-01", tmp_path / "archive", capsys)
    assert done["windows"] == ["w-oct-1", "w-oct-5"] and Path(done["archive"]).name.startswith("log-archive-20261005-seq1-")
    assert _verifies(Path(done["archive"]), capsys) and _verifies(three_windows, capsys)
    with LogReader(three_windows) as r:
        assert r.window_ids() == ["w-nov-20"]
        rec = [e.event() for e in r.iter(types=["log_archived"])]
    assert [(x.last_seq, x.head_hash) for x in rec] == [(done["last_seq"], done["head_hash"])]


def test_the_archive_is_the_exact_prefix_of_the_chain_it_came_from(three_windows, tmp_path, capsys):
    with LogReader(three_windows) as r:
        before = [(e.seq, e.hash) for e in r.iter()]
    done = _archive(three_windows, "2026-11-01", tmp_path / "archive", capsys)
    with LogReader(done["archive"]) as r:
        assert [(e.seq, e.hash) for e in r.iter()] == before[:done["last_seq"]]


def test_tampering_with_the_archive_is_detected(three_windows, tmp_path, capsys):
    done = _archive(three_windows, "2026-11-01", tmp_path / "archive", capsys)
    conn = sqlite3.connect(done["archive"])
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET payload = replace(payload, 'measured', 'failed') WHERE type = 'cell_recorded'")
    conn.commit()
    conn.close()
    assert not _verifies(Path(done["archive"]), capsys)


def test_rows_removed_from_the_live_log_without_an_archive_hand_over_are_detected(three_windows, capsys):
    conn = sqlite3.connect(three_windows)
    conn.execute("DROP TRIGGER events_no_delete")
    conn.execute("DELETE FROM events WHERE window_id = 'w-oct-1'")
    conn.commit()
    conn.close()
    assert not _verifies(three_windows, capsys)


def test_a_report_of_an_archived_window_comes_from_the_archive_with_its_chain_and_audit_ok(three_windows, tmp_path, capsys):
    done = _archive(three_windows, "2026-11-01", tmp_path / "archive", capsys)
    assert main(["report", done["archive"], "--window", "w-oct-5", "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["window_id"] == "w-oct-5" and r["integrity"]["chain_ok"] and r["integrity"]["audit_ok"]


def test_a_second_archive_continues_the_chain_from_the_first(three_windows, tmp_path, capsys):
    first = _archive(three_windows, "2026-11-01", tmp_path / "archive", capsys)
    second = _archive(three_windows, "2026-12-01", tmp_path / "archive", capsys)
    assert second["windows"] == ["w-nov-20"] and second["first_seq"] == first["last_seq"] + 1
    assert all(_verifies(p, capsys) for p in (Path(first["archive"]), Path(second["archive"]), three_windows))
    assert main(["report", second["archive"], "--window", "w-nov-20", "--format", "json"]) == 0


def test_nothing_closed_before_the_date_archives_nothing_and_changes_nothing(three_windows, tmp_path, capsys):
    with LogReader(three_windows) as r:
        n = r.count()
    assert _archive(three_windows, "2026-09-01", tmp_path / "archive", capsys) == {"archive": None, "windows": []}
    with LogReader(three_windows) as r:
        assert r.count() == n


async def test_archive_refuses_while_another_process_holds_the_log_open_for_writing(three_windows, tmp_path, capsys):
    import subprocess
    import sys
    store = await EventStore.open(three_windows)
    try:
        # blocking on purpose: this loop holds the log open for writing and has nothing else to do
        p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "log", "archive", str(three_windows),  # noqa: ASYNC221
                            "--before", "2026-11-01", "--to", str(tmp_path / "a")], capture_output=True, text=True, timeout=120)
    finally:
        await store.close()
    assert p.returncode == 2 and "another process is writing this log" in p.stderr
    assert not (tmp_path / "a").exists()


async def test_a_backup_taken_while_the_log_is_open_for_writing_verifies(three_windows, tmp_path, capsys):
    store = await EventStore.open(three_windows)
    try:
        capsys.readouterr()
        assert main(["log", "backup", str(three_windows), str(tmp_path / "copy.db")]) == 0
    finally:
        await store.close()
    assert _verifies(tmp_path / "copy.db", capsys)
    assert (tmp_path / "copy.db.checkpoint").is_file()
