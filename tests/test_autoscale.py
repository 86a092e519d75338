"""`rehearse --time-scale auto` chooses the fastest pace the machine can keep, with headroom, and says so."""

from __future__ import annotations

import asyncio

import pytest

from flare_diag.daemon.rehearsal import autoscale
from flare_diag.daemon.window.setup import read_plan


def _choose(plan_path) -> tuple[float, str]:
    raw, plan = read_plan(plan_path)
    return asyncio.run(autoscale.auto_time_scale(raw, plan, "flare-47581cca", 0, "glm-candidate", str(plan_path), None))


def test_auto_takes_the_top_scale_when_the_harness_costs_next_to_nothing(small_plan, monkeypatch):
    monkeypatch.setattr(autoscale, "HEADROOM", 1e-9)
    scale, said = _choose(small_plan)
    assert scale == autoscale.SCALES[0] and said.startswith("time scale x20 (auto:")


def test_auto_falls_to_real_time_when_no_faster_scale_fits_and_says_why(small_plan, monkeypatch):
    monkeypatch.setattr(autoscale, "HEADROOM", 1e7)  # as if every request cost the harness hours
    scale, said = _choose(small_plan)
    assert scale == 1.0 and "no faster scale fits the required cells" in said


def test_a_time_scale_that_is_neither_a_factor_nor_auto_exits_2_naming_it(tmp_path, capsys):
    from flare_diag.daemon.cli.commands import main
    with pytest.raises(SystemExit) as exc:
        main(["rehearse", "--time-scale", "fast", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "'fast'" in err and "or 'auto'" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("scale", [autoscale.SCALES[0]])
def test_every_auto_scale_is_one_the_plan_allows(small_plan, scale):
    from flare_diag.policies.scaling import time_scale_error
    _raw, plan = read_plan(small_plan)
    assert time_scale_error(plan, scale) is None
