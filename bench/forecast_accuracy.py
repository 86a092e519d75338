"""The forecast against the window: `rehearse` at each time scale, the schedule it started from
(`forecast.json`) beside each phase's actual end (`report.json`), in one run.

A refused rehearsal (exit 2) prints the forecast's reason. For the windows that ran: per phase the
forecast end, the in-window estimate made when the phase started, the actual end, and the error of
each against the plan's arm margin. With --calibrated, each window that ran is run again with
`--calibrate` on its own log (the tokens each body used, the pace and overhead it ran at).

Usage: python bench/forecast_accuracy.py [--scales 20 60 200] [--plan P] [--calibrated]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scales", nargs="+", type=float, default=[20.0, 60.0, 200.0])
    ap.add_argument("--plan", type=Path, default=ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml")
    ap.add_argument("--calibrated", action="store_true")
    args = ap.parse_args()
    for scale in args.scales:
        with tempfile.TemporaryDirectory() as tmp:
            if window(args.plan, Path(tmp) / "out", scale, []) and args.calibrated:
                window(args.plan, Path(tmp) / "again", scale, ["--calibrate", str(Path(tmp) / "out" / "log.db")])
    return 0


def window(plan: Path, out: Path, scale: float, extra: list[str]) -> bool:
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "rehearse", "--plan", str(plan), "--out", str(out),
                        "--time-scale", f"{scale:g}", *extra], cwd=ROOT, capture_output=True, text=True)
    print(f"== x{scale:g} {' '.join(extra)}: exit {p.returncode}")
    if p.returncode == 2:
        print("   refused before quiesce:", p.stderr.strip()[:400])
        return False
    sched = json.loads((out / "forecast.json").read_text())
    r = json.loads((out / "report.json").read_text())
    print(f"   forecast pace x{sched['pace']} + {sched['overhead_s']} s a request ({sched['calibration']}); "
          f"outcome {r['outcome']}, verdict {r['verdict']['hypothesis']}")
    fc = {s["phase"]: s for s in sched["slots"]}
    print(f"   {'phase':18} {'forecast end':>12} {'estimate at start':>18} {'actual end':>10} {'forecast err':>12}")
    worst = 0.0
    for c in r["cells"]:
        f = fc.get(c["phase"], {})
        if c.get("ended_minute") is None:
            continue
        err = None if f.get("end_min") is None else c["ended_minute"] - f["end_min"]
        if err is not None and f.get("required"):
            worst = max(worst, abs(err))
        print(f"   {c['phase']:18} {f.get('end_min') if f.get('end_min') is not None else '-':>12} "
              f"{c['estimated_end_minute']:>18.2f} {c['ended_minute']:>10.2f} "
              f"{'-' if err is None else f'{err:+.2f}':>12}")
    print(f"   largest |actual - forecast| over required phases: {worst:.2f} min "
          f"(arm margin {sched['margin_min']:g} min)")
    return True


if __name__ == "__main__":
    sys.exit(main())
