"""Property: a report can be projected and rendered from any prefix of a window's log (a running window)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events.envelope import Envelope
from events.report import project, render_json
from events.report_html import render_html
from events.report_md import render_md
from events.report_schema import validate
from tests.logtools import write_window

_ENVS: list[Envelope] = []


def _window_envelopes() -> list[Envelope]:
    if not _ENVS:  # one World-driven window, written once through the real store, shared by all examples
        from events.reader import LogReader
        with tempfile.TemporaryDirectory() as d:
            db = Path(d) / "log.db"
            asyncio.run(write_window(db))
            with LogReader(db) as r:
                _ENVS.extend(r.iter())
    return _ENVS


INTEGRITY = {"events": 0, "head_seq": 0, "head_hash": "", "chain_ok": True, "audit_ok": True}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.floats(min_value=0.0, max_value=1.0))
def test_any_prefix_of_a_window_projects_and_renders(cut):
    envs = _window_envelopes()
    prefix = envs[: int(cut * len(envs))]
    r = project(prefix, "w-report", INTEGRITY)
    data = render_json(r)
    assert render_md(r) and render_html(r).endswith("</html>\n")
    if r["outcome"] is not None:  # a closed window's report is complete by the contract's schema
        validate(data)
    assert len(r["cells"]) == len({c["phase"] for c in r["cells"]})
    assert all(q["phase"] in {c["phase"] for c in r["cells"]} or r["outcome"] is None
               for q in r["requests"])
