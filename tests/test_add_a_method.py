"""A second method, added the way docs/adapters.md says (a new module, registered; no generic rule
edited), runs through the real runner on the simulator: the generic rules hold for it, its verdict is
its own, and a plan naming a method this build does not have is refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flare_diag.policies import methods
from flare_diag.policies.core import WindowCore
from flare_diag.events.reader import LogReader
from flare_diag.events.schema import ActionRequested, TimeMarked
from flare_diag.policies.driver import Act, Proc
from flare_diag.policies.method import Method
from flare_diag.policies.phases import fresh_incarnation, run_phase
from flare_diag.policies.plan import Plan, PlanError, decode_plan
from flare_diag.policies.verdicts import Cells
from tests.simtools import flare_diag_here

ROOT = Path(__file__).resolve().parent.parent
SEED_PLAN = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"

# two replay phases, cold then warm, after the fresh incarnation's identity is verified (the forecast's
# arm rule lets an arm load an incarnation only where it verifies one)
TWO_PASS_PHASES = """
[[phases]]
id = "T.identity"
incarnation = "T"
kind = "identity"
fresh = true

[[phases]]
id = "T.cold"
incarnation = "T"
kind = "replay"
fixture = "tok1024"

[[phases]]
id = "T.warm"
incarnation = "T"
kind = "replay"
fixture = "tok1024"
prime = "T.cold"
"""


# --- the toy method: the whole of what adding one takes ---------------------------------------------

def _two_pass(w: WindowCore) -> Proc:
    """One fresh incarnation, the same bodies twice: does the second pass reuse what the first stored?"""
    if not (yield from fresh_incarnation(w, "T")):
        for ph in w.all_phases:
            w.record_cell(ph.id, "failed", w.state.failed_incarnations["T"], comparable=ph.comparable)
        return
    for ph in w.all_phases:
        yield from run_phase(w, ph)


def _two_pass_rule(plan: Plan, cells: Cells) -> tuple[str, str, str]:
    warm = cells.get("T.warm") or {}
    if warm.get("status") != "measured":
        return "inconclusive", f"T.warm is {warm.get('status') or 'not run'}", "Repeat the window."
    reused = (warm.get("host") or {}).get("reused_tokens")
    if reused:
        return "warm_reuse", f"T.warm reused {reused} host tokens", "None: the host cache serves a second pass."
    return "no_warm_reuse", "T.warm reused no host tokens", "Look at T.cold's host stores."


def _greedy(w: WindowCore) -> Proc:
    """A careless method: it loads, then sends the first body again and again and never looks at the clock."""
    if not (yield from fresh_incarnation(w, "T")):
        return
    ph = w.all_phases[1]
    sha = w.state.fixtures[ph.fixture or ""]["sha256"][0]
    k = 0
    while True:
        aid = w.request("send_request", {"phase": ph.id, "fixture": ph.fixture, "order_index": k, "body_index": 0,
                                         "body_sha256": sha}, True)
        yield Act([aid])
        k += 1


GREEDY = Method(name="greedy", summary="sends until stopped", run=_greedy, rule=_two_pass_rule)


TWO_PASS = Method(name="two_pass", summary="does a second pass of the same bodies reuse the first's host cache",
                  run=_two_pass, rule=_two_pass_rule)


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    methods.register(TWO_PASS)


def _plan_text(method: str) -> str:
    text = SEED_PLAN.read_text()
    head = text[:text.index("[starting_observation]")] + text[text.index("[[fixtures]]"):text.index("[[phases]]")]
    return f'method = "{method}"\n' + head.replace('name = "2026-10-22-cache-diagnosis"', 'name = "two-pass"') \
        + TWO_PASS_PHASES


# --- what it shows --------------------------------------------------------------------------------

def test_a_registered_method_runs_a_window_through_the_real_runner_to_its_own_verdict(tmp_path):
    plan = tmp_path / "two-pass.toml"
    plan.write_text(_plan_text("two_pass"))
    out = tmp_path / "out"
    rc, stdout, stderr = flare_diag_here("rehearse", "--plan", str(plan), "--out", str(out), "--json")
    assert rc == 0, stdout[-2000:] + stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    cells = {c["phase"]: c for c in report["cells"]}
    assert list(cells) == ["T.identity", "T.cold", "T.warm"]
    assert all(c["status"] == "measured" for c in cells.values()), cells
    assert report["verdict"]["hypothesis"] in ("warm_reuse", "no_warm_reuse")
    assert report["outcome"] == "completed"
    assert report["restoration"]["verified"] is True


def test_the_generic_stop_minute_cuts_a_method_that_never_stops_and_the_restore_still_runs(tmp_path):
    # GREEDY sends requests until something stops it: only the generic rules do (the stop minute, then
    # the restore within its reservation), and no experimental request goes out after the stop minute
    methods.register(GREEDY)
    plan = tmp_path / "greedy.toml"
    text = _plan_text("greedy")
    text = re.sub(r"(?m)^window_min = 90 .*$", "window_min = 26", re.sub(r"(?m)^stop_min = 70 .*$", "stop_min = 6", text))
    plan.write_text(text)
    out = tmp_path / "out"
    rc, stdout, stderr = flare_diag_here("rehearse", "--plan", str(plan), "--out", str(out), "--json", "--accept-partial")
    report = json.loads((out / "report.json").read_text())
    with LogReader(out / "log.db") as reader:
        events = [e.event() for e in reader.iter()]
    stop = next(i for i, e in enumerate(events) if isinstance(e, TimeMarked) and e.mark == "stop")
    sent = [i for i, e in enumerate(events) if isinstance(e, ActionRequested) and e.action == "send_request"]
    assert len(sent) > 10 and max(sent) < stop, (len(sent), stop)
    assert report["outcome"] == "partial", (rc, stdout[-1500:], stderr[-1500:])
    assert report["restoration"]["verified"] is True


def test_a_plan_naming_a_method_this_build_does_not_have_is_refused_by_name():
    with pytest.raises(PlanError, match=r"method = 'no_such_method': expected one of .*cache_diagnostics.*two_pass"):
        decode_plan(_plan_text("no_such_method").encode(), "two-pass.toml")


def test_a_second_method_under_a_name_already_taken_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        methods.register(Method(name="cache_diagnostics", summary="", run=_two_pass, rule=_two_pass_rule))


def test_a_plan_that_names_no_method_runs_the_seeds():
    plan = decode_plan(SEED_PLAN.read_bytes(), "seed")
    assert plan.method == methods.DEFAULT == "cache_diagnostics"


def test_adding_the_method_edited_no_generic_rule():
    # what docs/adapters.md promises: the generic modules name no method; only the registry knows the seed's
    generic = ["window.py", "core.py", "takedown.py", "restore.py", "rules.py", "guards.py", "verdicts.py", "method.py"]
    for name in generic:
        text = (ROOT / "policies" / name).read_text()
        assert "cache_diagnostics" not in text and "interpret" not in text, name


def test_plan_check_names_the_method_a_plan_runs(tmp_path, capsys):
    from flare_diag.daemon.cli.commands import main
    plan = tmp_path / "two-pass.toml"
    plan.write_text(_plan_text("two_pass"))
    assert main(["plan", "check", str(plan), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["method"] == "two_pass"
    assert main(["plan", "check", str(SEED_PLAN)]) == 0
    assert "method cache_diagnostics" in capsys.readouterr().out
