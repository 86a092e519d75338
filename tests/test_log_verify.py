"""`flare-diag log verify`: every kind of tampering is found at the right seq."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from flare_diag.daemon.cli.commands import main
from flare_diag.events.checkpoint import default_path, read_checkpoint
from flare_diag.events.reader import LogReader
from flare_diag.events.verify import verify_log
from tests.logtools import tamper, write_notes


@pytest.fixture
async def log10(tmp_path):
    path = tmp_path / "log.db"
    store = await write_notes(path, 10)
    await store.close()
    return path


def _verify(path):
    with LogReader(path) as r:
        return verify_log(r, read_checkpoint(default_path(path)))


def test_untampered_log_verifies(log10):
    res = _verify(log10)
    assert res.ok and res.events == 10 and res.head_seq == 10


def test_edited_payload_is_found_at_its_seq(log10):
    tamper(log10, """UPDATE events SET payload = CAST(REPLACE(CAST(payload AS TEXT), 'note 4', 'note X') AS BLOB) WHERE seq = 5""")
    res = _verify(log10)
    assert not res.ok and res.first_bad_seq == 5 and "edited" in res.problem


def test_edited_window_id_is_found_at_its_seq(log10):
    tamper(log10, "UPDATE events SET window_id = 'other' WHERE seq = 3")
    res = _verify(log10)
    assert not res.ok and res.first_bad_seq == 3


def test_deleted_row_is_found_as_a_gap(log10):
    tamper(log10, "DELETE FROM events WHERE seq = 6")
    res = _verify(log10)
    assert not res.ok and res.first_bad_seq == 6 and "gap" in res.problem


def test_reordered_rows_are_found_at_the_first_moved_seq(log10):
    tamper(log10,
           "UPDATE events SET seq = 1000 WHERE seq = 4",
           "UPDATE events SET seq = 4 WHERE seq = 7",
           "UPDATE events SET seq = 7 WHERE seq = 1000")
    res = _verify(log10)
    assert not res.ok and res.first_bad_seq == 4


def test_truncation_behind_the_checkpoint_is_found(log10):
    tamper(log10, "DELETE FROM events WHERE seq > 7")
    res = _verify(log10)
    assert not res.ok and res.first_bad_seq == 8 and "truncated" in res.problem


def test_truncation_without_checkpoint_still_verifies_the_prefix(log10):
    tamper(log10, "DELETE FROM events WHERE seq > 7")
    with LogReader(log10) as r:
        assert verify_log(r, None).ok


def test_cli_verify_prints_head_and_exits_0(log10, capsys):
    assert main(["log", "verify", str(log10)]) == 0
    assert "head seq 10" in capsys.readouterr().out


def test_cli_verify_exits_1_naming_the_bad_seq(log10, capsys):
    tamper(log10, "DELETE FROM events WHERE seq = 2")
    assert main(["log", "verify", str(log10)]) == 1
    assert "seq 2" in capsys.readouterr().out


def test_cli_verify_of_a_non_log_file_exits_2_with_one_line(tmp_path, capsys):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    assert main(["log", "verify", str(junk)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a flare-diag event log" in err[0]


def test_cli_verify_of_a_newer_store_version_exits_2(log10, capsys):
    conn = sqlite3.connect(log10)
    conn.execute("DROP TRIGGER meta_no_update")
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'store_version'")
    conn.commit()
    conn.close()
    assert main(["log", "verify", str(log10)]) == 2
    assert "newer" in capsys.readouterr().err


def test_cli_export_writes_one_json_line_per_event(log10, capsys):
    assert main(["log", "export", str(log10)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 10
    first = json.loads(lines[0])
    assert first["seq"] == 1 and first["payload"]["text"] == "note 0" and first["type"] == "log_note"


def test_cli_export_of_an_event_with_a_newer_schema_exits_2(log10, capsys):
    tamper(log10, "UPDATE events SET schema_v = 7 WHERE seq = 3")
    assert main(["log", "export", str(log10)]) == 2
    assert "newer" in capsys.readouterr().err


def test_console_script_is_installed_and_runs(log10):
    out = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "log", "verify", str(log10)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
