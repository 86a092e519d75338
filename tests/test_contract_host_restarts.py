"""Unseen engine restarts through the real runner, on the contract host (tests/contract_host.py), not flaresim.

The host's engine restarts under the same incarnation string, counters and cache back at zero, as a
supervisor's `Restart=` does. Wherever it falls the window names no cause, aborts `engine_restart`
(or, in the restore, starts the restore over) and exits 1 with the incumbent restored and verified.
Incarnations on this host: c1 the incumbent, c2 candidate A, c3 candidate B, c4 the restored incumbent.
"""

from __future__ import annotations

import pytest

from tests.contract_tools import ContractHost
from tests.test_contract_host import _without_trace, run_window

BODIES = 8  # the eight-body working set of the small plan

# where the restart falls -> the host's `restart` fault, and the cell it must leave invalid (None: none)
WHERE = {
    "during A's prime": ({"incarnation": "c2", "chats": 3}, "A.forward_prime"),
    "between A's replay and B's prime": ({"incarnation": "c3", "chats": 0, "scrapes_after": 1}, "B.forward_prime"),
    "during B's replay": ({"incarnation": "c3", "chats": BODIES + 3}, "B.forward_replay"),
    "during B's closing drain": ({"incarnation": "c3", "chats": 2 * BODIES, "scrapes_after": 2}, "B.forward_replay"),
}


@pytest.mark.parametrize("where", list(WHERE))
def test_an_unseen_restart_aborts_engine_restart_names_no_cause_and_restores(tmp_path, small_plan, where):
    fault, spanned = WHERE[where]
    host = ContractHost(tmp_path / "host", cache_entries=4, restart=fault)
    try:
        rc, r = run_window(host, tmp_path / "out", _without_trace(small_plan, tmp_path))
    finally:
        host.stop()
    assert (rc, r["outcome"]) == (1, "aborted"), (r["abort"], r["restoration"], r["alarms"])
    assert r["abort"]["reason"] == "engine_restart"
    assert r["verdict"]["hypothesis"] == "inconclusive" and "engine restarted" in r["verdict"]["basis"]
    cell = next(c for c in r["cells"] if c["phase"] == spanned)
    assert cell["status"] == "invalid" and "the engine restarted during this phase" in cell["reason"]
    assert r["restoration"]["verified"] and r["integrity"]["audit_ok"]


def test_a_restart_seen_only_by_its_counters_still_aborts(tmp_path, small_plan):
    """An engine that exports no process start time: the counters that went back are enough."""
    host = ContractHost(tmp_path / "host", cache_entries=4, no_start_time=True,
                        restart={"incarnation": "c3", "chats": BODIES + 3})
    try:
        rc, r = run_window(host, tmp_path / "out", _without_trace(small_plan, tmp_path))
    finally:
        host.stop()
    assert (rc, r["abort"]["reason"]) == (1, "engine_restart") and "went from" in r["abort"]["detail"]


def test_a_supervisor_reload_into_a_new_incarnation_before_any_counter_rose_aborts_engine_restart(tmp_path, small_plan):
    """The limit of counters and start times (docs/departures.md): a restart after the incarnation's first request,
    with no start time exported, leaves its counters as a scrape last saw them (0 to 0). Here it comes back as a
    new incarnation of the same recipe: the identity labels' one change is the incarnation, and that is a restart
    (it read `identity_drift` before)."""
    host = ContractHost(tmp_path / "host", cache_entries=4, no_start_time=True,
                        restart={"incarnation": "c2", "chats": 1, "new_id": True})
    try:
        rc, r = run_window(host, tmp_path / "out", _without_trace(small_plan, tmp_path))
    finally:
        host.stop()
    assert (rc, r["abort"]["reason"]) == (1, "engine_restart"), r["abort"]
    assert "incarnation: was 'c2', now 'c3'" in r["abort"]["detail"] and "went from" not in r["abort"]["detail"]
    cell = next(c for c in r["cells"] if c["phase"] == "A.forward_prime")
    assert cell["status"] == "invalid" and "the engine restarted during this phase" in cell["reason"]
    assert r["verdict"]["hypothesis"] == "inconclusive" and r["restoration"]["verified"]


def test_a_restart_during_the_restore_starts_the_restore_over_and_names_no_cause(tmp_path, small_plan):
    # the restored incumbent restarts once its direct preflight is answered: the last gate sees it
    host = ContractHost(tmp_path / "host", cache_entries=4, restart={"incarnation": "c4", "chats": 1})
    try:
        rc, r = run_window(host, tmp_path / "out", _without_trace(small_plan, tmp_path))
    finally:
        host.stop()
    assert (rc, r["outcome"], r["abort"]["reason"]) == (1, "aborted", "engine_restart"), (r["abort"], r["alarms"])
    assert [a for a in r["alarms"] if a["kind"] == "engine_restart_during_restore"]
    assert r["verdict"]["hypothesis"] == "inconclusive"
    assert r["restoration"]["verified"] and r["restoration"]["readmitted"]
