"""Property: a report can be projected and rendered from any prefix of a window's log (a running window)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flare_diag.events.envelope import Envelope
from flare_diag.events.report import project, render_json
from flare_diag.daemon.reports.report_html import render_html
from flare_diag.daemon.reports.report_md import render_md
from flare_diag.events.report_schema import validate
from tests.logtools import write_window

_ENVS: list[Envelope] = []


def _window_envelopes() -> list[Envelope]:
    if not _ENVS:  # one World-driven window, written once through the real store, shared by all examples
        from flare_diag.events.reader import LogReader
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


_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                            max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(report=st.dictionaries(st.text(max_size=8), _json_values, max_size=6),
       requests=st.none() | st.lists(st.dictionaries(st.text(max_size=4), _json_values, max_size=3), max_size=10),
       chunk=st.integers(min_value=1, max_value=5))
def test_report_json_in_pieces_is_the_bytes_of_one_encoding_whatever_the_report_holds(report, requests, chunk):
    # NUL and any other control character in a string, a "requests" key nested anywhere, rows
    # spanning several pieces: joined, the pieces are exactly msgspec's encoding of the whole.
    import msgspec

    import flare_diag.events.report as rep_mod
    if requests is not None:
        report = {**report, "requests": requests}
    saved, rep_mod.ROWS_PER_CHUNK = rep_mod.ROWS_PER_CHUNK, chunk
    try:
        assert b"".join(rep_mod.json_chunks(report)) == msgspec.json.encode(report) + b"\n"
    finally:
        rep_mod.ROWS_PER_CHUNK = saved


@settings(max_examples=200, deadline=None)
@given(segments=st.lists(st.text() | st.lists(st.text(), max_size=9), max_size=12),
       chunk=st.integers(min_value=1, max_value=4))
def test_text_in_pieces_is_the_utf8_of_the_joined_segments(segments, chunk):
    import flare_diag.events.report as rep_mod
    saved, rep_mod.ROWS_PER_CHUNK = rep_mod.ROWS_PER_CHUNK, chunk
    try:
        assert b"".join(rep_mod.text_chunks(segments)) == rep_mod.join_segments(segments).encode()
    finally:
        rep_mod.ROWS_PER_CHUNK = saved


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 5000), gap=st.integers(2, 50), cuts=st.lists(st.integers(0, 5000), max_size=12))
def test_a_series_thinned_in_slices_keeps_the_points_thinned_one_at_a_time(n, gap, cuts):
    from flare_diag.daemon.reports.charts import Decimated
    # a long series (the budget is hundreds of points) with a minute or a value missing now and then
    points = [(None if i % gap == 0 else i / 60, None if i % (gap + 3) == 1 else i * 7) for i in range(n)]
    one = Decimated()
    for x, y in points:
        if x is not None and y is not None:
            one.add(x, y)
    sliced = Decimated()
    bounds = [0, *sorted(c for c in cuts if c <= n), n]
    for a, b in zip(bounds, bounds[1:]):
        part = points[a:b]
        sliced.extend([x for x, _y in part], [y for _x, y in part])
    assert sliced.points() == one.points() and (sliced.stride, sliced.seen) == (one.stride, one.seen)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.one_of(st.tuples(st.just("add"), st.text(max_size=40)),
                                st.tuples(st.just("bytes"), st.binary(max_size=40)),
                                st.tuples(st.just("head"), st.text(max_size=20))), max_size=60))
def test_a_spool_reads_back_its_pieces_with_each_head_inserted_where_it_was_marked(steps):
    """What a long window's html tables rely on: a phase's head, counted after its rows, reads back before them."""
    from flare_diag.daemon.reports import report_spool
    spool, want, marks = report_spool.Spooled(), bytearray(), []
    try:
        for kind, piece in steps:
            if kind == "add":
                spool.add(piece)
                want += piece.encode()
            elif kind == "bytes":
                spool.add_bytes(piece)
                want += piece
            else:  # a head for everything written since the last one, known only now
                at = marks[-1][0] if marks else 0
                marks.append((spool.tell(), at, piece))
        for _end, at, piece in marks:
            spool.insert(at, piece)
        expected, pos = bytearray(), 0
        for _end, at, piece in marks:
            expected += want[pos:at] + piece.encode()
            pos = at
        expected += want[pos:]
        assert b"".join(spool.blocks()) == bytes(expected)
        assert b"".join(spool.blocks()) == bytes(expected)  # a second read gives the same bytes
    finally:
        spool.close()
