"""Records the replay corpus: logs of windows this build ran, replayed and audited by every later build.

A change that would decide differently on one of these logs fails `tests/test_replay_corpus.py`. When
the change is meant (a new rule, a new read), say so in its commit, raise the policy's version where
the log's meaning changes, and record the corpus again: `python -m tests.replay_corpus`. A window
added later is recorded alone (`python -m tests.replay_corpus NAME`): the others stay as the builds
that wrote them left them.
"""

from __future__ import annotations

import gzip
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "replay"
PLAN = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"

# name -> rehearse arguments (on the eight-body plan; the first keeps its trace arms)
WINDOWS = {
    "completed-default": [],
    "restore-path": ["--scenario", "restore-stalled", "--no-trace"],
    "identity-drift-tp": ["--fault", "identity_drift@request=4,field=tensor_parallel", "--no-trace"],
    "restore-failed-gate": ["--fault", "auth@request=3", "--fault", "queue_growth@after_load=2", "--no-trace"],
    "prime-invalid": ["--fault", "drain_stall@after_request=8,duration_s=60", "--no-trace"],
    # the shipped plan's 52 bodies (not the eight-body plan): a churn verdict whose basis carries a count
    # of 1,000 and more (added in session 16: a build that grouped such counts inside the policy reworded
    # the decision of every churn window ever recorded)
    "churn-52": ["--shipped-plan", "--no-trace"],
}


def small_plan(folder: Path, trace: bool, shipped: bool = False) -> Path:
    text = PLAN.read_text().replace('name = "2026-10-22-cache-diagnosis"', 'name = "replay-corpus"')
    if not shipped:
        text = text.replace('fixture = "c1-52"', 'fixture = "tok1024"')
    if not trace:
        text = text[:text.index("[trace]")] + text[text.index("[[conditional]]"):]
    p = folder / f"plan{'-52' if shipped else ''}{'' if trace else '-no-trace'}.toml"
    p.write_text(text)
    return p


def record(names: list[str] | None = None) -> None:
    from flare_diag.daemon.cli.commands import main
    CORPUS.mkdir(parents=True, exist_ok=True)
    unknown = sorted(set(names or ()) - set(WINDOWS))
    if unknown:
        raise SystemExit(f"replay_corpus: no window named {', '.join(unknown)} (windows: {', '.join(WINDOWS)})")
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in WINDOWS.items():
            if names and name not in names:
                continue
            trace = "--no-trace" not in args
            plan = small_plan(Path(tmp), trace, shipped="--shipped-plan" in args)
            out = Path(tmp) / name
            main(["rehearse", "--plan", str(plan), "--out", str(out),
                  *[a for a in args if a not in ("--no-trace", "--shipped-plan")]])
            with open(out / "log.db", "rb") as src, gzip.open(CORPUS / f"{name}.db.gz", "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
            print(f"recorded {name}", file=sys.stderr)


if __name__ == "__main__":
    record(sys.argv[1:] or None)
