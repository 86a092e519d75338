"""The window's state as a value: `evolve(state, fact)` is pure (the state it was given is left as it was), has a
rule for every fact, keeps the first of what the contract keeps once, and refuses a stage move the table forbids."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flare_diag.events.actions import make
from flare_diag.events.schema import ActionDone
from flare_diag.events.stages import Stage, StageError
from flare_diag.policies import evolve as ev
from flare_diag.policies.guards import Baseline
from flare_diag.policies.plan import Growth
from flare_diag.policies.planner import BodyWork, Learned
from flare_diag.policies.restarts import RestartWatch
from flare_diag.policies.state import AbortRecord, Asked, Cell, Running, WindowState
from flare_diag.policies.steady import Guard, Tally

NAMES = st.sampled_from(["A.forward_replay", "B.identity", "gpu", "router", "x"])
JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | NAMES,
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3), max_leaves=6)


def _for(t: mi.Type) -> st.SearchStrategy[Any]:
    """A strategy for one field's type, as msgspec describes it."""
    if isinstance(t, mi.StrType):
        return NAMES
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.IntType):
        return st.integers(0, 10**12)
    if isinstance(t, mi.FloatType):
        return st.floats(0, 1e9, allow_nan=False)
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.UnionType):
        return st.one_of([_for(u) for u in t.types])
    if isinstance(t, mi.DictType):
        return st.dictionaries(NAMES, _for(t.value_type), max_size=3)
    if isinstance(t, mi.VarTupleType):
        return st.lists(_for(t.item_type), max_size=3).map(tuple)
    if isinstance(t, mi.TupleType):
        return st.tuples(*[_for(i) for i in t.item_types])
    if isinstance(t, mi.StructType):
        return _struct(t.cls)
    return JSONISH  # Any


def _struct(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    if cls is Growth:
        return st.just(Growth())
    if cls is Guard:
        return st.builds(Guard, name=NAMES, query=st.just("up"), threshold=st.floats(0, 10), breach_if=st.sampled_from([">", "<"]))
    info = mi.type_info(cls)
    return st.builds(cls, **{f.name: _for(f.type) for f in info.fields if f.required or f.name in ("done",)})


FACTS = st.one_of([_struct(kind) for kind in ev.FACTS])


def test_every_fact_has_a_rule() -> None:
    assert set(ev.Fact.__subclasses__()) == set(ev.FACTS)


def test_a_fact_without_a_rule_is_refused() -> None:
    class Stray(ev.Fact, frozen=True):
        pass
    with pytest.raises(ev.UnknownFact, match="Stray"):
        ev.evolve(WindowState(), Stray())


@settings(max_examples=150, deadline=None)
@given(st.lists(FACTS, max_size=25))
def test_evolve_leaves_the_state_it_was_given_as_it_was(facts: list[ev.Fact]) -> None:
    state = WindowState()
    for fact in facts:
        before = copy.deepcopy(state)
        try:
            after = ev.evolve(state, fact)
        except StageError:
            after = state  # a move the stages table forbids: a bug in a decider that asked for it
        assert state == before
        assert isinstance(after, WindowState)
        state = after


@settings(max_examples=60, deadline=None)
@given(st.lists(FACTS, max_size=25))
def test_the_same_facts_fold_to_the_same_state(facts: list[ev.Fact]) -> None:
    def fold() -> WindowState:
        s = WindowState()
        for f in facts:
            try:
                s = ev.evolve(s, f)
            except StageError:
                pass
        return s
    assert fold() == fold()


def test_a_phase_keeps_its_first_cell() -> None:
    first = Cell(phase="A.forward_replay", status="measured", reason="ok")
    s = ev.evolve(WindowState(), ev.CellDecided(cell=first))
    s = ev.evolve(s, ev.CellDecided(cell=Cell(phase="A.forward_replay", status="invalid", reason="later")))
    assert s.cells == {"A.forward_replay": first} and s.status("A.forward_replay") == "measured"


def test_a_body_keeps_the_prompt_size_first_counted() -> None:
    s = ev.evolve(WindowState(), ev.PromptCounted(incarnation="B", body_sha256="ab", seen=(120, "B.forward", 3)))
    s = ev.evolve(s, ev.PromptCounted(incarnation="B", body_sha256="ab", seen=(90, "B.reverse", 7)))
    assert s.prompt_seen == {("B", "ab"): (120, "B.forward", 3)}


def test_a_fault_during_the_restore_is_kept_once() -> None:
    s = WindowState()
    for what in ("gpu_fault: Xid 48", "containment: admitted", "gpu_fault: Xid 48"):
        s = ev.evolve(s, ev.RestoreFaulted(what=what))
    assert s.restore_faults == ("gpu_fault: Xid 48", "containment: admitted")


def test_a_stage_move_the_table_forbids_is_refused() -> None:
    with pytest.raises(StageError, match="idle cannot move to experiment"):
        ev.evolve(WindowState(), ev.ClockStarted(at_ns=1))


def test_the_stages_move_as_a_window_does() -> None:
    s = ev.evolve(WindowState(), ev.Opened())
    s = ev.evolve(s, ev.ClockStarted(at_ns=5))
    s = ev.evolve(s, ev.RestoreBegun(cause="completed", started_minute=61.0, end_ns=9))
    s = ev.evolve(s, ev.Closed())
    assert (s.stage, s.t0, s.restore_cause, s.restore_end_ns) == (Stage.CLOSED, 5, "completed", 9)


def test_the_trace_switch_is_held_only_where_the_engine_reports_one() -> None:
    s = ev.evolve(WindowState(), ev.IdentityVerified(incarnation="B", identity={"model": "m", "trace_enabled": False}))
    s = ev.evolve(s, ev.IdentityVerified(incarnation="C", identity={"model": "m", "trace_enabled": None}))
    s = ev.evolve(ev.evolve(s, ev.TraceSwitched(incarnation="B", on=True)), ev.TraceSwitched(incarnation="C", on=True))
    assert s.verified_identity == {"B": {"model": "m", "trace_enabled": True}, "C": {"model": "m"}}


def test_a_restored_incumbent_is_the_windows_to_judge_only_if_it_took_the_host_down() -> None:
    assert ev.evolve(WindowState(), ev.IncumbentReturned()).incumbent_back is False
    assert ev.evolve(WindowState(took_down=True), ev.IncumbentReturned()).incumbent_back is True


def test_the_running_phase_counts_its_answered_requests_in_a_new_value() -> None:
    running = Running(id="A.forward_replay", total=52, comparable=True, started_minute=3.0, estimated_end_minute=9.0)
    s = ev.evolve(ev.evolve(WindowState(), ev.PhaseRunning(running=running, at_ns=7)), ev.RequestsDone(done=12))
    assert (s.current.done if s.current else None, running.done, s.current_since_ns) == (12, 0, 7)


def test_growth_is_judged_from_the_incarnations_first_resident_memory_without_changing_the_baseline() -> None:
    first = Baseline()
    after, hit = first.check({"resident_bytes": 1e9}, 0, Growth())
    assert (first, after.resident, hit) == (Baseline(), 1e9, None)
    _same, hit = after.check({"resident_bytes": 1e9 + Growth().max_resident_growth_bytes + 1}, 0, Growth())
    assert hit is not None and hit[0] == "uncontrolled_growth"


def test_a_counter_that_goes_back_is_seen_against_the_watch_before_it() -> None:
    watch = RestartWatch().observed({"prompt_tokens": 50.0}, {}, "inc-1")
    assert watch.restart_seen({"prompt_tokens": 10.0}, {}, "inc-2") == (
        "the engine restarted unseen as a new incarnation (inc-1 -> inc-2): prompt_tokens went from 50 to 10")
    assert watch.counters == {"prompt_tokens": 50.0}


def test_a_guards_run_of_breaches_is_a_new_tally_each_evaluation() -> None:
    g = Guard(name="p99", query="up", threshold=1.0, breach_if=">")
    t0 = Tally()
    t1, run = t0.observe(g, 2.0)
    t2, run2 = t1.said("p99", dry_run=False).observe(g, 0.5)
    assert (t0, run, run2, t2.restore_said) == (Tally(), 1, 0, frozenset())


def test_an_abort_is_recorded_as_given() -> None:
    record = AbortRecord("engine_lost", "B.identity: gone", 12.5)
    assert ev.evolve(WindowState(), ev.Aborted(record=record)).abort == record


def _asked(aid: int, for_id: int | None = None) -> ev.ActionAsked:
    return ev.ActionAsked(action_id=aid, asked=Asked(make("health"), False, aid if for_id is None else for_id))


def test_the_window_clock_never_goes_back() -> None:
    s = ev.evolve(ev.evolve(WindowState(), ev.ClockAdvanced(at_ns=50)), ev.ClockAdvanced(at_ns=20))
    assert s.now_ns == 50


def test_an_answer_is_kept_for_the_procedure_until_it_takes_it() -> None:
    s = ev.evolve(ev.evolve(WindowState(), _asked(1)), _asked(2))
    done = ActionDone(at_ns=3, action_id=1, ok=True)
    s = ev.evolve(s, ev.ActionAnswered(action_id=1, answer=done))
    assert (list(s.asked), s.answered, s.next_action_id) == ([2], {1: done}, 3)
    assert ev.evolve(s, ev.AnswersTaken(ids=(1,))).answered == {}


def test_a_read_asked_again_after_a_restart_answers_under_the_id_the_procedure_waits_on() -> None:
    s = ev.evolve(ev.evolve(WindowState(), _asked(4)), ev.ActionDropped(action_id=4))
    s = ev.evolve(s, _asked(9, for_id=4))
    s = ev.evolve(s, ev.ActionAnswered(action_id=9, answer=ActionDone(at_ns=5, action_id=9, ok=True)))
    assert (s.asked, list(s.answered)) == ({}, [4])


def test_an_answer_nobody_asked_for_changes_nothing() -> None:
    s = ev.evolve(WindowState(), _asked(1))
    assert ev.evolve(s, ev.ActionAnswered(action_id=7, answer=ActionDone(at_ns=1, action_id=7, ok=True))) is s


def test_a_round_that_teaches_no_new_tokens_leaves_the_learned_maps_as_they_were() -> None:
    body = BodyWork("ab", 100)
    once = Learned().with_tokens([(body, 40)], [("ab", 900)])
    again = once.with_tokens([(body, 40)], [("ab", 900)])
    assert again is once and once.share_of == {"ab": 0.4} and once.prompt == {"ab": 900}
    timed = again.with_round(2.0, 3.0)
    assert (timed.sums, timed.rounds, timed.completion is once.completion) == ((2.0, 4.0, 3.0, 6.0), 1, True)
