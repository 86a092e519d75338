"""Benchmarks at a small size, so that none of them rots (the figures themselves are in docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_identity_hold_bench_runs_and_prints_its_ratio():
    p = subprocess.run([sys.executable, "bench/identity_hold.py", "--rounds", "20"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "scrape and identity" in p.stdout and "(ratio " in p.stdout


def test_the_fleet_bench_runs_and_prints_its_ratios():
    p = subprocess.run([sys.executable, "bench/fleet.py", "--hosts", "8", "--events", "100", "--windows", "500",
                        "--ingest", "2000", "--leases", "40"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "(ratio " in p.stdout and "lag p50" in p.stdout and "fleet status" in p.stdout
    assert "3 granted (never more than 3)" in p.stdout
