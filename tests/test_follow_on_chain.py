"""The second window end to end on flaresim: a churn window, `reproduce --fit`, `plan follow-on`, the
follow-on windows run interleaved as the plan orders them, and `report compare` judging them, with the
output-consistency phase as independent correctness.

The windows are the shipped plan's shape on the first twelve bodies of c1-52, on a churn scenario
whose row pool is scaled to that working set (32 rows against c1-52's 64 for 52 bodies): seconds a
window instead of tens.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flare_diag.policies.plan import decode_plan
from tests.reviewtools import follow_on_reviewed
from tests.simtools import flare_diag_here

ROOT = Path(__file__).resolve().parent.parent
BODIES = 12


def _cli(*args: str) -> tuple[int, str]:
    rc, out, err = flare_diag_here(*args)
    return rc, out + err


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder with the twelve-body fixture, the plan on it, and the scaled churn scenarios (sound,
    and with an unsound marconi build)."""
    d = tmp_path_factory.mktemp("chain")
    src = ROOT / "fixtures" / "data" / "c1-52"
    m = json.loads((src / "manifest.json").read_text())
    fx = d / f"c1-{BODIES}"
    fx.mkdir()
    (fx / "bodies.jsonl").write_bytes(b"".join(b + b"\n" for b in (src / "bodies.jsonl").read_bytes().split(b"\n")[:BODIES]))
    (fx / "manifest.json").write_text(json.dumps({"name": fx.name, "count": BODIES, "sha256": m["sha256"][:BODIES],
                                                  "sampling": m["sampling"], "prompt_tokens": m["prompt_tokens"][:BODIES]}))
    plan = (ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml").read_text()
    (d / "plan.toml").write_text(plan.replace('"c1-52"', f'"{fx.name}"').replace("select_last = 12", "select_last = 4")
                                 .replace('name = "2026-10-22-cache-diagnosis"', 'name = "chain"'))
    churn = (ROOT / "fixtures" / "flaresim" / "scenarios" / "churn.toml").read_text().replace("rows_capacity = 64",
                                                                                             "rows_capacity = 32")
    (d / "churn.toml").write_text(churn)
    (d / "unsafe.toml").write_text(churn.replace('name = "churn"', 'name = "unsafe"')
                                   + 'unsafe_reuse_builds = ["glm-candidate-marconi"]\n')
    return d


@pytest.fixture(scope="module")
def source(site) -> Path:
    out = site / "source"
    rc, said = _cli("rehearse", "--plan", str(site / "plan.toml"), "--scenario", str(site / "churn.toml"),
                    "--out", str(out))
    assert rc == 0, said[-2000:]
    assert json.loads((out / "report.json").read_text())["verdict"]["hypothesis"] == "row_checkpoint_churn"
    return out


def _window(site: Path, plan: Path, recipe: str, name: str, scenario: str = "churn.toml") -> str:
    out = site / name
    rc, said = _cli("rehearse", "--plan", str(plan), "--scenario", str(site / scenario), "--candidate", recipe,
                    "--out", str(out))
    assert rc == 0, said[-2000:]
    return str(out)


@pytest.fixture(scope="module")
def marconi_sides(site, source) -> dict[str, list[str]]:
    """The marconi follow-on's six windows, run in the plan's own order."""
    plan = site / "marconi.toml"
    rc, said = _cli("plan", "follow-on", str(source), "--policy", "marconi", *follow_on_reviewed(Path(source), "marconi"),
                    "--scenario", str(site / "churn.toml"),
                    "--out", str(plan))
    assert rc == 0, said
    fo = decode_plan(plan.read_bytes()).follow_on
    recipe = {"baseline": f"glm-candidate-{fo.baseline_policy}", "candidate": f"glm-candidate-{fo.policy}"}
    sides: dict[str, list[str]] = {"baseline": [], "candidate": []}
    for i, side in enumerate(fo.order):
        sides[side].append(_window(site, plan, recipe[side], f"marconi-{i}-{side}"))
    return sides


def test_the_reproducer_fits_the_churn_window_the_follow_on_starts_from(source, capsys):
    rc, said = _cli("reproduce", str(source), "--fit")
    assert rc == 0, said
    assert "best fit" in said.lower()


def test_a_follow_on_plan_orders_its_windows_abba_and_ends_with_a_consistency_phase_on_a_fresh_incarnation(
        site, marconi_sides):
    plan = decode_plan((site / "marconi.toml").read_bytes())
    assert plan.follow_on.order == ["baseline", "candidate", "candidate", "baseline", "baseline", "candidate"]
    *_, ident, cons = plan.phases
    assert ident.kind == "identity" and ident.fresh and cons.kind == "consistency" and cons.incarnation == ident.incarnation
    greedy = json.loads((site / cons.fixture / "bodies.jsonl").read_text().splitlines()[0])
    assert greedy["temperature"] == 0 and greedy["max_tokens"] <= 256


def test_a_policy_that_reuses_more_is_accepted_over_three_interleaved_repeats_with_its_intervals(marconi_sides):
    rc, said = _cli("report", "compare", "--windows", *marconi_sides["candidate"], "--baseline",
                    *marconi_sides["baseline"], "--json")
    out = json.loads(said.strip().splitlines()[-1])
    assert rc == 0 and out["accepted"] is True, out["reason"]
    ttft = out["statistics"]["median_ttft_ms"]
    assert ttft["change"] >= 0.05 and ttft["interval"][0] <= ttft["change"] <= ttft["interval"][1]
    assert all(r["correct"] for r in out["runs"].values())


def test_compare_prints_the_benefit_it_decides_on_with_that_figures_interval(marconi_sides):
    args = ("report", "compare", "--windows", *marconi_sides["candidate"], "--baseline", *marconi_sides["baseline"])
    rc, said = _cli(*args, "--json")
    out = json.loads(said.strip().splitlines()[-1])
    assert out["statistics"]["median_ttft_ms"]["change"] == out["primary_benefit"]  # one estimator, not two
    rc, said = _cli(*args)
    shown = re.search(r"median_ttft_ms: .*?benefit ([+-][\d.]+)%", said).group(1)
    decided = re.search(r"primary benefit ([\d.]+)%", said).group(1)
    assert float(shown) == float(decided), said


def test_the_follow_on_windows_each_find_their_build_consistent_under_reuse(marconi_sides):
    for out in (*marconi_sides["candidate"], *marconi_sides["baseline"]):
        cells = json.loads((Path(out) / "report.json").read_text())["cells"]
        cons = next(c for c in cells if c.get("consistency"))
        assert cons["status"] == "measured" and cons["consistency"]["consistent"], cons["reason"]
        assert cons["consistency"]["reused_warm"] > 0 and cons["consistency"]["compared"] == BODIES


def test_a_policy_that_does_not_help_is_rejected_and_the_comparison_says_why(site, source, marconi_sides):
    plan = site / "no-help.toml"
    # the incumbent's own policy as the candidate build: the gate refuses it, --force records the override
    rc, said = _cli("plan", "follow-on", str(source), "--policy", "lru_leaf", "--force", "--scenario",
                    str(site / "churn.toml"), "--out", str(plan), *follow_on_reviewed(Path(source), "lru_leaf"))
    assert rc == 0 and "FORCED" in said
    candidates = [_window(site, plan, "glm-candidate-lru_leaf", f"no-help-{i}") for i in range(3)]
    rc, said = _cli("report", "compare", "--windows", *candidates, "--baseline", *marconi_sides["baseline"])
    assert rc == 1 and "not accepted: primary benefit 0.0% is below 5%" in said


def test_a_build_whose_answers_change_under_reuse_fails_correctness_although_its_latency_improves(site, source):
    plan = site / "unsafe-follow-on.toml"
    rc, said = _cli("plan", "follow-on", str(source), "--policy", "marconi", *follow_on_reviewed(Path(source), "marconi"),
                    "--scenario", str(site / "churn.toml"),
                    "--out", str(plan))
    assert rc == 0, said
    cand = _window(site, plan, "glm-candidate-marconi", "unsafe-candidate", "unsafe.toml")
    base = _window(site, plan, "glm-candidate-lru_leaf", "unsafe-baseline", "unsafe.toml")
    report = json.loads((Path(cand) / "report.json").read_text())
    cons = next(c for c in report["cells"] if c.get("consistency"))
    assert cons["consistency"]["differ"] and cons["reason"].startswith("INCONSISTENT")
    assert (Path(cand) / "report.md").read_text().count("OUTPUTS CHANGED UNDER REUSE") == 1
    rc, said = _cli("report", "compare", "--windows", cand, "--baseline", base, "--repeats", "1", "--json")
    out = json.loads(said.strip().splitlines()[-1])
    assert out["statistics"]["median_ttft_ms"]["change"] >= 0.05  # faster...
    assert rc == 1 and not out["accepted"] and "outputs changed under reuse" in out["reason"]  # ...and wrong
