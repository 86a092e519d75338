"""Reviews for the tests' windows: a production plan runs only with a recorded review of its exact bytes
by someone other than its author (`flare-diag review sign`), so the tests record one as a reviewer would."""

from __future__ import annotations

import itertools
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REVIEWER = "test-reviewer"


_LOGS = Path(tempfile.mkdtemp(prefix="flare-diag-reviews-"))  # never beside a plan in the repository
_count = itertools.count()


def reviewed(plan: Path, log: Path | None = None) -> list[str]:
    """Records a review of `plan` (by REVIEWER) in a review log of its own; the `run` flags that name it."""
    log = log or _LOGS / f"reviews-{next(_count)}.db"
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "review", "sign", str(plan), "--by", REVIEWER,
                        "--log", str(log)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return ["--reviews", str(log)]


def with_review(argv: list[str]) -> list[str]:
    """`flare-diag run ...` arguments with a review of their --plan added (other commands unchanged). A
    plan or fixture that cannot be reviewed (refused as it is read) goes unreviewed: the run that follows
    is refused for the same reason, which is what such a test checks."""
    if not argv or argv[0] != "run" or "--plan" not in argv or "--reviews" in argv:
        return list(argv)
    try:
        return [*argv, *reviewed(Path(argv[argv.index("--plan") + 1]))]
    except AssertionError:
        return list(argv)


def review_over_socket(plan: Path, socket: Path) -> None:
    """A review of `plan` by REVIEWER, recorded in the daemon's log over its control socket."""
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "review", "sign", str(plan), "--by", REVIEWER,
                        "--socket", str(socket)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def follow_on_reviewed(source: Path, policy: str, log: Path | None = None, by: str = REVIEWER) -> list[str]:
    """A review of a follow-on from the window in `source` (an out folder, with its report.json) with `policy`,
    recorded in a review log of its own (never the source log, which other tests read); the flags naming it."""
    import json
    window = json.loads((source / "report.json").read_text())["window_id"]
    log = log or _LOGS / f"follow-on-{next(_count)}.db"
    p = subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", "review", "sign", window, "--policy", policy,
                        "--by", by, "--note", "source window and policy change checked", "--log", str(log)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return ["--reviews", str(log)]


def review_command(plan_raw: bytes, dirs: list[Path] | None = None):
    """The control command `review sign PLAN --by REVIEWER` sends for these plan bytes (fixtures from `dirs`,
    then the built-in ones), for a service driven in this process."""
    from flare_diag.daemon.service.control import ReviewSign
    from flare_diag.daemon.window.reviews import subject
    from flare_diag.daemon.window.setup import load_fixtures
    from flare_diag.policies.plan import decode_plan
    p = decode_plan(plan_raw)
    sha, manifests = subject(plan_raw, load_fixtures(p, dirs or []))
    return ReviewSign(plan_name=p.name, plan_sha256=sha, author=p.author, fixtures=manifests, by=REVIEWER)
