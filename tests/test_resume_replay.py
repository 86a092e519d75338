"""A recovery replays the recorded inputs and compares every decision with the one the log holds."""

from __future__ import annotations

import msgspec

from flare_diag.daemon.window.runner import replay
from flare_diag.events.schema import Alarm, DaemonRestarted, Input, RestoreStarted
from flare_diag.policies.window import WindowPolicy
from tests.policy_world import World, drive, plan_builtins


def _recorded(n_inputs: int) -> list:
    """(seq, event) as a log holds them."""
    history = drive(WindowPolicy(), World(plan_builtins()))
    out: list = []
    for inp, ds in history[:n_inputs]:
        out += [inp, *ds]
    return list(enumerate(out, 1))


def test_replaying_an_unchanged_log_finds_no_divergence():
    assert replay(WindowPolicy(), _recorded(300)) is None


def test_a_recorded_decision_the_policy_does_not_make_is_named_with_its_input():
    rec = _recorded(300)
    i = next(k for k, (_seq, ev) in enumerate(rec) if type(ev).__name__ == "PhaseStarted")
    seq, started = rec[i]
    rec[i] = (seq, msgspec.structs.replace(started, phase="not-a-phase"))
    why = replay(WindowPolicy(), rec)
    assert why is not None and "replayed decisions differ" in why
    n_inputs = sum(isinstance(ev, Input) for _seq, ev in rec[:i])
    assert f"at seq {seq}, after input {n_inputs}" in why and "not-a-phase" in why


def test_a_restart_with_mismatches_raises_resume_mismatch_and_restores():
    pol = WindowPolicy()
    rec = _recorded(200)
    assert replay(pol, rec) is None
    ds = pol.receive(DaemonRestarted(at_ns=pol.now + 1, unanswered=sorted(pol.state.asked),
                                     mismatches=["site profile /x changed since the window opened"]))
    alarms = [d for d in ds if isinstance(d, Alarm)]
    assert [a.kind for a in alarms] == ["resume_mismatch"] and "site profile /x" in alarms[0].detail
    assert any(isinstance(d, RestoreStarted) for d in ds)


def test_a_window_opened_by_another_policy_version_is_resumed_with_that_named_as_a_mismatch(tmp_path):
    """A daemon upgraded inside a window restores it with this build's policy; its recovery names the
    upgrade among the mismatches (which the resume_mismatch alarm carries: the test above); a window
    this build opened names none."""
    import hashlib

    from flare_diag.daemon.cli.commands import main
    from flare_diag.daemon.window.recovery import setup_for_recovery
    from flare_diag.daemon.window.setup import policy_version
    from flare_diag.events.schema import WindowOpened

    assert main(["init-site", "flare", str(tmp_path)]) == 0
    for token in tmp_path.glob("*.token"):
        token.write_text("not-a-real-token\n")
    profile = tmp_path / "flare.toml"
    raw = profile.read_bytes()
    ours = WindowOpened(at_ns=0, window_id="w1", plan=plan_builtins(), plan_sha256="p", site="flare", gpu_source="nvml",
                        rehearsal=False, candidate_recipe="glm-candidate", policy_sha256=policy_version(),
                        site_profile=str(profile), site_profile_toml=raw.decode(),
                        site_profile_sha256=hashlib.sha256(raw).hexdigest())
    older = msgspec.structs.replace(ours, policy_sha256="0" * 64)
    (_setup, same), (setup, upgraded) = setup_for_recovery(ours), setup_for_recovery(older)
    assert same == []
    assert upgraded == [f"policy version {policy_version()[:12]} is not the 000000000000 the window opened with "
                        f"(the daemon was upgraded inside the window)"]
    assert setup.plan == _setup.plan and setup.site == _setup.site  # the recorded plan and profile drive the restore
