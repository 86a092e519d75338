"""A daemon killed at any point of a restore resumes it: the reads that had no recorded answer are asked
again, so a restore never fails for a read that was never answered (issue 49). Each crash is the
daemon's own recovery: the recorded inputs replayed into a fresh policy (runner.replay, which checks every
decision against the record), then `daemon_restarted`, then the host answering from where it was."""

from __future__ import annotations

import pytest

from flare_diag.daemon.window.runner import replay
from flare_diag.events.schema import (
    ActionDone, ActionRequested, CancelRequested, DaemonRestarted, RequestDone, RestorationRecorded, RestoreStarted, Tick,
    WindowClosed,
)
from flare_diag.policies.window import RE_ASKABLE, WindowPolicy
from tests.policy_world import World, drive, plan_builtins


class Crash(Exception):
    pass


def _restore_answers() -> list[int]:
    """Every answer the restore of a healthy window waits for, by its ordinal among the window's answers
    (not its history position: the watches' inputs fed with an answer would step over a position)."""
    h = drive(WindowPolicy(), World(plan_builtins()))
    start = next(i for i, (_inp, ds) in enumerate(h) if any(isinstance(d, RestoreStarted) for d in ds))
    answers = [i for i, (inp, _ds) in enumerate(h) if isinstance(inp, (ActionDone, RequestDone))]
    return [k for k, i in enumerate(answers) if i > start]


ANSWERS = _restore_answers()


def _crash_and_resume(at: int, performed: bool) -> tuple[list, str]:
    """Runs the window until its answer number `at`, where the daemon dies before that answer reaches the
    log (`performed`: the host had carried the action out); then the recovery and the rest of the restore.
    Returns (every decision after the restart, the action whose answer was lost)."""
    world = World(plan_builtins())
    lost = [""]
    counted = [0, 0]  # history entries read, answers among them

    def hook(w: World, history):
        for inp, _ds in history[counted[0]:]:
            counted[1] += isinstance(inp, (ActionDone, RequestDone))
        counted[0] = len(history)
        if counted[1] >= at:
            raise Crash
        return None
    policy = WindowPolicy()
    try:
        drive(policy, world, hook)
    except Crash:
        pass
    recorded = [ev for inp, ds in _history_of(policy) for ev in (inp, *ds)]
    asked = {d.action_id: d for ev in recorded if isinstance(ev, ActionRequested) for d in [ev]}
    answered = {ev.action_id for ev in recorded if isinstance(ev, (ActionDone, RequestDone))}
    cancelled = {a for ev in recorded if isinstance(ev, CancelRequested) for a in ev.action_ids}
    outstanding = [asked[a] for a in sorted(set(asked) - answered - cancelled)]
    if performed and outstanding:  # the host did it; the daemon died before it heard back
        world.answer(outstanding[0])
    lost[0] = outstanding[0].action if outstanding else ""
    fresh = WindowPolicy()
    assert replay(fresh, enumerate(recorded, 1)) is None  # the recovery rebuilds exactly this window
    out = fresh.receive(DaemonRestarted(at_ns=world.now + 1, unanswered=sorted(fresh.state.asked)))
    queue = [d for d in out if isinstance(d, ActionRequested)]
    seen = list(out)
    for _ in range(5000):
        if fresh.closed:
            return seen, lost[0]
        if queue:
            res = world.answer(queue.pop(0))
        else:
            world.now = max(world.now, fresh.next_wakeup_ns() or world.now)
            res = Tick(at_ns=world.now)
        ds = fresh.receive(res)
        seen += ds
        queue += [d for d in ds if isinstance(d, ActionRequested)]
    raise AssertionError("the resumed restore did not close")


def _history_of(policy: WindowPolicy) -> list:
    return policy.history  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _keep_history(monkeypatch):
    """Every (input, decisions) the policy took, as the log would hold them."""
    real = WindowPolicy.receive

    def receive(self, inp):
        ds = real(self, inp)
        self.__dict__.setdefault("history", []).append((inp, list(ds)))
        return ds
    monkeypatch.setattr(WindowPolicy, "receive", receive)


@pytest.mark.parametrize("performed", [False, True], ids=["not-performed", "performed"])
def test_a_daemon_killed_at_any_point_of_a_restore_never_fails_it_for_a_read_it_never_heard(performed):
    assert len(ANSWERS) > 15  # the manager, the load, the scrapes, the snapshots, the gate, the readmit...
    for at in ANSWERS:
        seen, lost = _crash_and_resume(at, performed)
        res = [d for d in seen if isinstance(d, RestorationRecorded)][-1]
        closed = [d for d in seen if isinstance(d, WindowClosed)][-1]
        if lost in RE_ASKABLE or not lost:
            assert res.verified, (at, lost, res.checks)
        else:  # a host change whose answer was lost is possibly done: only its own check may say so
            failed = {k for k, v in res.checks.items() if v is False}
            assert res.verified or failed <= {"readmitted", "routed_preflight", "no_fault_during_restore"}, (at, lost, failed)
        assert closed.outcome in ("aborted", "completed", "restore_failed")


def test_a_read_asked_again_after_a_restart_is_the_answer_the_restore_uses():
    at = next(i for i in ANSWERS)
    seen, lost = _crash_and_resume(at, performed=False)
    again = [d for d in seen if isinstance(d, ActionRequested) and d.action == lost]
    assert lost in RE_ASKABLE and again, lost  # the lost read went out again under a new id
    assert [d for d in seen if isinstance(d, RestorationRecorded)][-1].verified
