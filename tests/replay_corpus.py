"""Records the replay corpus: logs of windows this build ran, replayed and audited by every later build.

A change that would decide differently on one of these logs fails `tests/test_replay_corpus.py`. When
the change is meant (a new rule, a new read), say so in its commit, raise the policy's version where
the log's meaning changes, and record the corpus again: `python -m tests.replay_corpus`.
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
    "restore-failed-gate": ["--fault", "auth@request=3", "--fault", "queue_growth@load=2", "--no-trace"],
    "prime-invalid": ["--fault", "drain_stall@after_request=8,duration_s=60", "--no-trace"],
}


def small_plan(folder: Path, trace: bool) -> Path:
    text = PLAN.read_text().replace('fixture = "c1-52"', 'fixture = "tok1024"').replace(
        'name = "2026-10-22-cache-diagnosis"', 'name = "replay-corpus"')
    if not trace:
        text = text[:text.index("[trace]")] + text[text.index("[[conditional]]"):]
    p = folder / ("plan.toml" if trace else "plan-no-trace.toml")
    p.write_text(text)
    return p


def record() -> None:
    from flare_diag.daemon.cli.commands import main
    CORPUS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in WINDOWS.items():
            trace = "--no-trace" not in args
            plan = small_plan(Path(tmp), trace)
            out = Path(tmp) / name
            main(["rehearse", "--plan", str(plan), "--out", str(out), *[a for a in args if a != "--no-trace"]])
            with open(out / "log.db", "rb") as src, gzip.open(CORPUS / f"{name}.db.gz", "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
            print(f"recorded {name}", file=sys.stderr)


if __name__ == "__main__":
    record()
