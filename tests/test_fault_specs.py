"""Rehearsal faults as an operator names them: a phase's n-th request, before or after a load, and each
fault accounted for in the report, fired or not (issue 53)."""

from __future__ import annotations

import pytest

from flare_diag.daemon.rehearsal.rehearse import parse_fault
from flare_diag.daemon.window.setup import InputError
from tests.simtools import flare_diag_here
from tests.test_fault_matrix import rehearse, rehearse_printing


def test_a_fault_spec_names_a_phase_and_a_requests_order_in_it():
    f = parse_fault("xid@B.forward_replay#12,xid=48")
    assert f["at"] == {"phase": "B.forward_replay", "request": 12} and f["xid"] == 48


@pytest.mark.parametrize("spec", ["xid@B.forward_replay#-1", "xid@#3", "xid@B.forward_replay#x", "xid@a b#2"])
def test_a_phase_request_that_is_not_a_phase_and_an_order_is_refused_naming_the_spec(spec):
    with pytest.raises(InputError, match="expected PHASE#N"):
        parse_fault(spec)


def test_the_old_load_moment_is_refused_with_the_two_that_say_when():
    with pytest.raises(InputError) as exc:
        parse_fault("xid@load=1")
    assert "@after_load=N" in str(exc.value) and "@before_load=N" in str(exc.value)


def test_a_fault_bound_to_a_phase_the_plan_lacks_exits_2_naming_the_plans_phases(small_plan, tmp_path):
    rc, _out, err = flare_diag_here("rehearse", "--plan", str(small_plan), "--out", str(tmp_path / "o"),
                                    "--fault", "xid@B.forward_replayy#2")
    assert rc == 2 and "phase 'B.forward_replayy'" in err and "B.forward_replay," in err
    assert not (tmp_path / "o" / "log.db").exists()


def test_a_fault_at_a_phases_request_2_fails_that_request_and_no_other(small_plan, tmp_path):
    rc, r = rehearse(small_plan, tmp_path / "out", "--fault", "oom@A.reverse_replay#2")
    cells = {c["phase"]: c for c in r["cells"]}
    assert rc == 1 and r["abort"]["reason"] == "gpu_fault"
    assert cells["A.forward_prime"]["status"] == "measured"
    assert "after 2 of 8 requests" in cells["A.reverse_replay"]["reason"]
    assert r["faults"] == [{"spec": "oom@A.reverse_replay#2", "fired": True}]
    assert r["abort"]["detail"].startswith("A.reverse_replay #2 (action ")  # the abort numbers it alike


def test_a_load_failure_before_the_first_load_fails_that_load_and_after_it_the_next(small_plan, tmp_path):
    _rc, before = rehearse(small_plan, tmp_path / "before", "--fault", "load_failure@before_load=1,count=1")
    _rc, after = rehearse(small_plan, tmp_path / "after", "--fault", "load_failure@after_load=1,count=1")
    status = lambda r, p: next(c["status"] for c in r["cells"] if c["phase"] == p)  # noqa: E731
    assert status(before, "A.identity") != "measured"  # A's own load failed
    assert status(after, "A.identity") == "measured" and status(after, "B.identity") != "measured"


def test_a_fault_that_never_fired_is_listed_and_needs_attention(small_plan, tmp_path):
    # the window closes long before a ninth load: this fault tested nothing, and the report says so
    rc, r, _stdout = rehearse_printing(small_plan, tmp_path / "out", "--fault", "xid@before_load=9")
    md = (tmp_path / "out" / "report.md").read_text()
    assert rc == 0 and r["faults"] == [{"spec": "xid@before_load=9", "fired": False}]
    assert "FAULT NEVER FIRED: xid@before_load=9" in md.split("## Verdict")[0]  # at the top
    assert "- xid@before_load=9: NEVER FIRED" in md
