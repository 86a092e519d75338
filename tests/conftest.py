"""Fixtures shared by the window tests that run against flaresim."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def small_plan(tmp_path_factory) -> Path:
    """The 2026-10-22 plan's shape on the eight-body tok1024 working set: whole windows in seconds."""
    text = (ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml").read_text()
    p = tmp_path_factory.mktemp("plan") / "fault-matrix.toml"
    p.write_text(text.replace('fixture = "c1-52"', 'fixture = "tok1024"')
                 .replace('name = "2026-10-22-cache-diagnosis"', 'name = "fault-matrix"'))
    return p
