"""Tamper evidence beyond the chain: published anchors, signed checkpoints, and a daemon that will not
bless a log it cannot vouch for (issue 18, item 11; threat model in docs/event-log.md)."""

from __future__ import annotations

import json
import shutil
import sqlite3

import msgspec
import pytest

from flare_diag.daemon.cli.commands import main
from flare_diag.daemon.reports.publish import build_report
from flare_diag.events.checkpoint import default_path
from flare_diag.events.store import EventStore
from tests.logtools import forge, write_window

YEAR_NS = 365 * 86_400 * 10**9
KEY = b"k" * 32


def _relabel(row: dict) -> dict:
    """A rehearsal relabelled as a live run on a production site, one year earlier."""
    row["wall_ns"] -= YEAR_NS
    if row["type"] == "window_opened":
        ev = json.loads(bytes(row["payload"]))
        ev.update(rehearsal=False, site="prod-gpu-07", gpu_source="nvml")
        row["payload"] = msgspec.json.encode(ev)
    return row


@pytest.fixture
async def published(tmp_path):
    """A closed window's log, and its report as published outside the database."""
    db = tmp_path / "log.db"
    await write_window(db, "w-anchor")
    report = build_report(db, "w-anchor")
    (tmp_path / "report.json").write_text(json.dumps(report))
    return db, tmp_path / "report.json"


def test_the_relabel_forgery_passes_the_chain_alone(published, capsys):
    db, _report = published
    forge(db, _relabel)
    assert main(["log", "verify", str(db)]) == 0  # what the chain and an unsigned checkpoint can prove: nothing here


def test_the_relabel_forgery_is_caught_by_the_published_anchor(published, capsys):
    db, report = published
    forge(db, _relabel)
    assert main(["log", "verify", str(db), "--anchor", str(report)]) == 1
    assert "differs from the anchor" in capsys.readouterr().out


def test_the_relabel_forgery_is_caught_by_a_signed_checkpoint(tmp_path, capsys):
    db = tmp_path / "log.db"
    key = tmp_path / "checkpoint.key"
    key.write_bytes(KEY)

    async def signed():
        store = await EventStore.open(db)
        store.checkpoint_key = KEY
        from flare_diag.events.schema import LogNote
        await store.append_many([LogNote(text=f"n{i}") for i in range(5)], window_id="w")
        await store.close()
    import asyncio
    asyncio.run(signed())
    assert main(["log", "verify", str(db), "--key", str(key)]) == 0
    forge(db, _relabel)  # the forger rewrites the checkpoint too, but cannot sign it
    capsys.readouterr()
    assert main(["log", "verify", str(db), "--key", str(key)]) == 1
    assert "not signed" in capsys.readouterr().out


def test_truncation_with_no_checkpoint_is_caught_against_an_anchor(published, capsys):
    db, report = published
    default_path(db).unlink()
    conn = sqlite3.connect(db)
    conn.execute("DROP TRIGGER events_no_delete")
    conn.execute("DELETE FROM events WHERE seq > (SELECT MAX(seq) - 20 FROM events)")
    conn.commit()
    conn.close()
    assert main(["log", "verify", str(db)]) == 0  # a prefix verifies on its own
    assert main(["log", "verify", str(db), "--anchor", str(report)]) == 1
    assert "truncated: anchor records seq" in capsys.readouterr().out


def test_an_anchor_given_as_seq_and_hash_is_checked(published, capsys):
    db, report = published
    integ = json.loads(report.read_text())["integrity"]
    assert main(["log", "verify", str(db), "--anchor", f"{integ['head_seq']}:{integ['head_hash']}"]) == 0
    assert main(["log", "verify", str(db), "--anchor", f"{integ['head_seq']}:{'0' * 64}"]) == 1
    assert main(["log", "verify", str(db), "--anchor", "junk"]) == 2


def test_the_daemon_refuses_to_append_to_a_laundered_log(published, tmp_path):
    from tests.daemontools import Daemon
    db, _report = published
    state = tmp_path / "state"
    state.mkdir()
    # a truncated copy of the log with the original's checkpoint, dropped into the daemon's state folder
    shutil.copy(db, state / "log.db")
    shutil.copy(default_path(db), default_path(state / "log.db"))
    conn = sqlite3.connect(state / "log.db")
    conn.execute("DROP TRIGGER events_no_delete")
    conn.execute("DELETE FROM events WHERE seq > 30")
    conn.commit()
    conn.close()
    before = (state / "log.db").read_bytes()
    d = Daemon(tmp_path)
    with pytest.raises(AssertionError):
        d.start(timeout=15)
    assert d.proc.wait(10) == 1
    refusal = [r for r in d.records() if r.get("event") == "refusing the event log"]
    assert refusal and "truncated" in refusal[0]["problem"]
    assert (state / "log.db").read_bytes() == before  # nothing appended, nothing blessed


def test_a_report_of_a_log_whose_chain_is_broken_exits_1_and_says_so_first(published, capsys):
    from tests.logtools import tamper
    db, _report = published
    tamper(db, "UPDATE events SET wall_ns = wall_ns + 1 WHERE seq = 5")
    capsys.readouterr()
    assert main(["report", str(db), "--format", "md"]) == 1
    captured = capsys.readouterr()
    head = captured.out.splitlines()[:12]
    assert any("LOG INTEGRITY FAILED" in line for line in head), head
    assert "does not verify" in captured.err


def test_a_report_of_a_log_with_an_event_that_does_not_decode_exits_1_in_one_line(published, capsys):
    from tests.logtools import tamper
    db, _report = published
    tamper(db, "UPDATE events SET payload = CAST('{}' AS BLOB) WHERE seq = 5")
    capsys.readouterr()
    assert main(["report", str(db), "--format", "md"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seq 5" in err[0] and "do not decode" in err[0]


def test_an_event_chained_on_after_the_anchored_head_fails_the_anchor_naming_its_seq(published, capsys):
    """Anyone who can write the file can append a correctly chained event (a forged verdict, say): the
    published anchor vouches only up to its own seq."""
    import anyio

    from flare_diag.events.schema import LogNote
    from flare_diag.events.store import EventStore
    db, report = published
    head = json.loads(report.read_text())["integrity"]["head_seq"]

    async def forge() -> None:
        store = await EventStore.open(db)
        try:
            await store.append(LogNote(text="a verdict nobody decided"), window_id="w")
        finally:
            await store.close()
    anyio.run(forge)
    capsys.readouterr()
    assert main(["log", "verify", str(db)]) == 0  # the chain alone holds: it was chained on
    assert main(["log", "verify", str(db), "--anchor", str(report)]) == 1
    assert f"FAILED at seq {head + 1}: seq {head + 1} to {head + 1} come after the anchored head seq {head}" \
        in capsys.readouterr().out


def test_a_damaged_index_page_fails_log_verify_through_sqlite_s_own_check(tmp_path, capsys):
    """Every row's hash can be intact while a b-tree page of the file is not: `log verify` asks SQLite's
    integrity_check first and says what it found (here SQLite refuses the page outright: it names no page)."""
    import anyio
    import sqlite3

    from flare_diag.events.schema import LogNote
    from flare_diag.events.store import EventStore
    db = tmp_path / "log.db"

    async def write() -> None:
        store = await EventStore.open(db)
        try:
            await store.append_many([LogNote(text=f"note {i} " + "x" * 200) for i in range(400)], window_id="w")
        finally:
            await store.close()
    anyio.run(write)
    with sqlite3.connect(db) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        idx = c.execute("SELECT rootpage FROM sqlite_master WHERE type = 'index' ORDER BY rootpage DESC").fetchone()[0]
        page = c.execute("PRAGMA page_size").fetchone()[0]
    with open(db, "r+b") as f:  # an index page's cells (at the page's end) scrambled; the table's rows untouched
        f.seek(idx * page - 512)
        f.write(b"\xff" * 512)
    capsys.readouterr()
    rc = main(["log", "verify", str(db)])
    cap = capsys.readouterr()
    assert rc == 1 and "SQLITE INTEGRITY CHECK FAILED" in cap.out, (cap.out, cap.err)
