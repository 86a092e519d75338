"""Logs recorded by earlier builds (tests/data/replay, written by `python -m tests.replay_corpus`) are
verified, audited (every recorded input replayed into this build's policy, every decision compared)
and reported by this build: a change that would decide differently on an old log fails here."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from flare_diag.daemon.cli.commands import main
from tests.replay_corpus import CORPUS, WINDOWS

# what each recorded window ended as, and the verdict it gave
EXPECTED = {
    "completed-default": ("completed", "key_or_checkpoint_eligibility"),  # the GPU prefix cache holds 8 bodies
    "restore-path": ("completed", "restore_path"),
    "identity-drift-tp": ("aborted", "inconclusive"),
    "restore-failed-gate": ("restore_failed", "inconclusive"),
    "prime-invalid": ("partial", "inconclusive"),
    "churn-52": ("completed", "row_checkpoint_churn"),  # the shipped plan's bodies: 135223 tokens in its basis
}


def _log(tmp_path: Path, name: str) -> Path:
    db = tmp_path / f"{name}.db"
    with gzip.open(CORPUS / f"{name}.db.gz", "rb") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return db


def test_the_corpus_holds_every_recorded_window():
    assert sorted(p.name.removesuffix(".db.gz") for p in CORPUS.glob("*.db.gz")) == sorted(WINDOWS) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_an_old_log_verifies_and_replays_to_the_same_decisions(tmp_path, capsys, name):
    db = _log(tmp_path, name)
    assert main(["log", "verify", str(db)]) == 0, capsys.readouterr()
    assert main(["log", "audit", str(db)]) == 0, capsys.readouterr().out[-2000:]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_an_old_log_reports_the_outcome_and_verdict_it_closed_with(tmp_path, capsys, name):
    db = _log(tmp_path, name)
    capsys.readouterr()
    assert main(["report", str(db), "--format", "json"]) in (0, 1)
    r = json.loads(capsys.readouterr().out)
    assert (r["outcome"], r["verdict"]["hypothesis"]) == EXPECTED[name]
