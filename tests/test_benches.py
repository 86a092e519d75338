"""Benchmarks at a small size, so that none of them rots (the figures themselves are in docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_identity_hold_bench_runs_and_prints_its_ratio():
    p = subprocess.run([sys.executable, "bench/identity_hold.py", "--rounds", "20"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "scrape and identity" in p.stdout and "(ratio " in p.stdout


def test_the_fleet_bench_runs_and_prints_its_ratios():
    p = subprocess.run([sys.executable, "bench/fleet.py", "--hosts", "8", "--events", "200", "--windows", "500", "--steady", "2",
                        "--ingest", "2000", "--leases", "40", "--procs", "2"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "equal-work floor" in p.stdout and "from memory" in p.stdout and "lag p50" in p.stdout and "steady state" in p.stdout and "fleet status" in p.stdout
    assert "3 granted (never more than 3)" in p.stdout
    assert "CPU over the phase" in p.stdout and "the server " in p.stdout


def test_the_cache_model_bench_runs_the_earlier_model_beside_the_current_one_and_they_choose_alike():
    """On the fixture bodies and on the Mooncake trace (../shared/traces where it is checked out beside
    the repository, else the tests' first 1,000 requests): the same choices both times."""
    p = subprocess.run([sys.executable, "bench/cache_model.py", "--requests", "1000", "--synthetic", "5000",
                        "--capacity-blocks", "512", "--mooncake", "800"], cwd=ROOT, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.stdout.count("same choices: True") == 2, p.stdout
    assert "goal under 45 s" in p.stdout


@pytest.mark.parametrize("bench,args,says", [
    ("event_log.py", ["--appends", "2000", "--single", "30", "--verify", "5000"],
     ("ratio store/floor", "ratio store/eventsourcing p50", "ratio store/eventsourcing-from-loop", "ratio verify/preimage")),
    ("event_log_parts.py", ["--commits", "20", "--bulk-commits", "4", "--rounds", "1"],
     ("append   single (median us", "append bulk 100", "ratio store/eventsourcing", "sql bulk 100 (eventsourcing table)")),
    ("harness_overhead.py", ["--rounds", "1", "--time-scale", "100"], "ratio runner/bare"),
    ("report.py", ["--events", "20000", "--rounds", "1", "--memory"], ("ratio report/fold", "peak RSS of this process")),
    ("metrics_scrape.py", ["--engines", "1", "--rounds", "3"], ("the same values both ways", "ratio read/whole")),
    ("cli_startup.py", ["--rounds", "1"], ("ratio flare-diag status (no daemon)/bare interpreter", "ratio flare-diag --help", "ratio (flare-diag status - status query", "ratio (flare-diag fleet status - psql")),
    ("client_accuracy.py", ["--requests", "20", "--runs", "1", "--aiperf", "", "--tls"],
     ("C1: flare-diag TTFT error median", "C4: flare-diag TTFT error median", "aiperf not run",
      "C1: flare-diag over https TTFT error median", "ratio https/http median")),
])
def test_every_bench_runs_at_a_small_size_and_prints_its_figure(bench, args, says):
    p = subprocess.run([sys.executable, f"bench/{bench}", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert all(s in p.stdout for s in ((says,) if isinstance(says, str) else says)), p.stdout


def test_the_forecast_accuracy_bench_runs_at_a_small_size_and_prints_its_error(tmp_path):
    from tests.daemontools import one_phase_plan
    plan = one_phase_plan(tmp_path / "one-phase.toml")  # a window in a second at x400
    p = subprocess.run([sys.executable, "bench/forecast_accuracy.py", "--scales", "400", "--plan", str(plan)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "largest |actual - forecast|" in p.stdout


def test_the_rehearsal_bench_runs_a_short_plan_in_virtual_time_and_prints_its_figure(tmp_path):
    """The shipped plan's rehearsal is the suite's `default_rehearsal`; here the bench itself, on a plan cut
    to one identity phase (tests/daemontools.py), so that it runs in seconds."""
    from tests.daemontools import one_phase_plan
    plan = one_phase_plan(tmp_path / "short.toml")
    p = subprocess.run([sys.executable, "bench/rehearse.py", "--skip-wall", "--plan", str(plan)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "virtual time" in p.stdout and "outcome" in p.stdout
