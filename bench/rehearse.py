"""The default rehearsal in virtual time against the wall-clock rehearsal it replaced, side by side.

Runs `flare-diag rehearse` (the 2026-10-22 plan, the default scenario) twice as separate processes:
in virtual time (the default since issue 14), then paced on the wall clock at `--wall-scale` (x20
was the default before). Prints each one's wall time, outcome and measured required cells, and the
ratio wall-clock / virtual (goal: the virtual rehearsal in 20 s or less, every required cell measured).

Usage: python bench/rehearse.py [--wall-scale 20] [--skip-wall] [--plan PLAN]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = ("A.identity", "A.forward_prime", "A.reverse_replay", "B.identity", "B.forward_prime", "B.forward_replay")


def one(out: Path, *extra: str) -> tuple[float, dict]:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "rehearse", "--out", str(out), *extra], cwd=ROOT,
                   capture_output=True, timeout=3600)
    took = time.monotonic() - t0
    return took, json.loads((out / "report.json").read_text())


def summary(label: str, took: float, r: dict) -> str:
    cells = {c["phase"]: c["status"] for c in r["cells"]}
    measured = sum(cells.get(p) == "measured" for p in REQUIRED)
    return (f"{label:<28} {took:7.1f} s wall   outcome {r['outcome']:<10} required cells measured {measured}/{len(REQUIRED)}"
            f"   closed at minute {max((c['ended_minute'] or 0) for c in r['cells']):.1f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wall-scale", type=float, default=20.0)
    ap.add_argument("--skip-wall", action="store_true", help="only the virtual-time rehearsal")
    ap.add_argument("--plan", help="another plan than the shipped one (the suite's smoke run takes a short one)")
    a = ap.parse_args()
    plan = ("--plan", str(Path(a.plan).resolve())) if a.plan else ()
    with tempfile.TemporaryDirectory() as tmp:
        v_took, v = one(Path(tmp) / "virtual", *plan)
        print(summary("virtual time", v_took, v))
        if a.skip_wall:
            return 0
        w_took, w = one(Path(tmp) / "wall", *plan, "--time-scale", f"{a.wall_scale:g}")
        print(summary(f"wall clock x{a.wall_scale:g}", w_took, w))
    print(f"ratio wall-clock / virtual = {w_took / v_took:.1f} (goal: virtual <= 20 s; it took {v_took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
