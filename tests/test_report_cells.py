"""Property: a request row's count cells are the count grouped by thousands (a negative delta, a
counter's reset, too), whether or not the same value was formatted before (the cells are kept by
value) and whichever of int or float it is."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flare_diag.daemon.reports.report_view import request_row

_COUNTS = st.one_of(st.none(), st.integers(min_value=-10**7, max_value=10**13),
                    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9))


def _expected(v) -> str:
    return "n/a" if v is None else f"{v}" if -1000 < v < 1000 else f"{v:,}"


def _row(v) -> dict:
    delta = dict.fromkeys(("host_lookups", "host_hits", "host_fetched_tokens", "host_reused_tokens", "gpu_reused_tokens"), v)
    return {"phase": "P1.forward_replay", "order_index": 3, "body_sha256": "ab" * 32, "prompt_tokens": v,
            "completion_tokens": v, "cached_tokens": v, "finish_reason": "stop", "visible_output": True,
            "reasoning_only": False, "first_token_ns": 1, "end_ns": 2, "outcome": "ok", "natural_failure": None,
            "delta": delta}


@given(values=st.lists(_COUNTS, min_size=1, max_size=8))
def test_count_cells_are_grouped_counts_seen_before_or_not(values):
    # each value twice, and an integral one also as its float twin (1717 and 1717.0 are one dict key)
    seq = [w for v in values for w in (v, v, *((float(v),) if type(v) is int and abs(v) < 2**53 else ()))]
    for v in seq:
        cells = request_row(_row(v))
        assert cells[3:6] + cells[10:15] == (_expected(v),) * 8, v
