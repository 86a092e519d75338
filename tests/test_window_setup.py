"""What `run` and `start` check before anything starts: a production plan gets its GPUs watched."""

from __future__ import annotations
from tests.reviewtools import with_review

from pathlib import Path

import pytest

from flare_diag.daemon.cli.commands import main
from flare_diag.daemon.hosts.nvml import available as nvml_unavailable

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION_PLAN = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"
PEER_PLAN = ROOT / "fixtures" / "plans" / "peer-llamacpp.toml"


def _site(tmp_path: Path, gpu: str) -> Path:
    (tmp_path / "serving.token").write_text("t0ken-not-for-logs\n")
    site = tmp_path / "site.toml"
    site.write_text(f"""
[serving]
url = "http://127.0.0.1:9"
token_file = "serving.token"
[manager]
url = "http://127.0.0.1:9"
candidate_recipe = "glm-candidate"
[gpu]
{gpu}
""")
    return site


def _run(plan: Path, site: Path, out: Path, capsys) -> tuple[int, str]:
    rc = main(with_review(["run", "--plan", str(plan), "--site", str(site), "--out", str(out)]))
    return rc, capsys.readouterr().err


def test_a_production_plan_on_a_site_that_watches_no_gpu_exits_2_and_starts_nothing(tmp_path, capsys):
    rc, err = _run(PRODUCTION_PLAN, _site(tmp_path, 'source = "none"'), tmp_path / "out", capsys)
    assert rc == 2 and err.count("\n") == 1
    assert "gpu.source" in err and "production plan" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(nvml_unavailable() is None, reason="NVML initialises on this machine, so nothing is refused")
def test_a_production_plan_without_nvml_exits_2_saying_why_and_starts_nothing(tmp_path, capsys):
    rc, err = _run(PRODUCTION_PLAN, _site(tmp_path, 'source = "nvml"'), tmp_path / "out", capsys)
    assert rc == 2 and err.count("\n") == 1
    assert "needs NVML" in err and "t0ken" not in err
    assert not (tmp_path / "out").exists()


def test_a_plan_that_is_not_production_may_run_on_a_site_without_a_gpu(tmp_path):
    from flare_diag.daemon.window.setup import setup_for_site
    setup = setup_for_site(PEER_PLAN, _site(tmp_path, 'source = "none"'))
    assert not setup.plan.production and not setup.rehearsal


@pytest.mark.parametrize("scale", ["2", "20"])
def test_a_scaled_clock_on_a_site_that_is_not_simulated_is_refused_in_one_line(tmp_path, capsys, scale):
    rc = main(["run", "--plan", str(PRODUCTION_PLAN), "--site", str(_site(tmp_path, 'source = "nvml"')),
               "--out", str(tmp_path / "out"), "--time-scale", scale])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "only a simulated site" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("scale", ["0.5", "0", "-3", "nan", "inf", "1e308", "3000"])
def test_a_time_scale_below_1_not_finite_or_above_what_the_plan_allows_is_refused_in_one_line(tmp_path, capsys, scale):
    rc = main(["run", "--plan", str(PRODUCTION_PLAN), "--site", str(_site(tmp_path, 'source = "sim"')),
               "--out", str(tmp_path / "out"), "--time-scale", scale])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("flare-diag: error: --time-scale"), err
    assert ("expected at most 215 for this plan" in err) if scale in ("1e308", "3000") else ("at least 1" in err), err
    assert not (tmp_path / "out").exists()


def _start_on(tmp_path, gpu: str, time_scale: float) -> None:
    """`start`'s setup (the daemon's, over the socket) of the production plan on a site of this GPU source."""
    from flare_diag.daemon.window.setup import setup_for_start
    sites = tmp_path / "sites"
    sites.mkdir()
    _site(sites, gpu)
    setup_for_start(PRODUCTION_PLAN.read_bytes(), "plan.toml", "site", sites, time_scale=time_scale)


def test_start_over_the_socket_with_an_absurd_time_scale_is_refused_before_anything_is_read(tmp_path):
    from flare_diag.daemon.window.setup import InputError
    with pytest.raises(InputError, match="expected at most 215 for this plan"):
        _start_on(tmp_path, 'source = "sim"', 1e308)


def test_start_with_a_scaled_clock_on_a_production_site_is_refused_before_anything_is_read_from_the_host(tmp_path):
    from flare_diag.daemon.window.setup import InputError
    with pytest.raises(InputError, match="only a simulated site"):
        _start_on(tmp_path, 'source = "nvml"', 20)
