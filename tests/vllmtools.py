"""A real vLLM (0.32.0, the CPU build) for the tests: its install, a tiny model, a site profile that runs it,
and `run` through the CLI. The install is cached outside the clone (fixtures/engines/vllm/install.sh:
about three minutes cold; the `vllm_python` and `model` fixtures are in tests/conftest.py, one model a
module); the model is written with random weights."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "fixtures" / "engines" / "vllm"
PLAN = ROOT / "fixtures" / "plans" / "peer-vllm.toml"
SMALL_BLOCKS, LARGE_BLOCKS = 64, 4096  # the 30 bodies take about 225 blocks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_site(tmp: Path, python: Path, model: Path, blocks: int, plan_text: str | None = None) -> tuple[Path, Path]:
    """A site profile for vLLM with a prefix cache of `blocks` blocks, and the peer plan beside it."""
    site_dir = tmp / "site"
    site_dir.mkdir()
    (site_dir / "model").symlink_to(model)
    (site_dir / "serving.token").write_text(os.urandom(12).hex())
    (site_dir / "site.toml").write_text((ENGINE / "site.template.toml").read_text().format(
        port=_free_port(), python=python, blocks=blocks))
    plan = tmp / "peer-vllm.toml"
    plan.write_text(plan_text or PLAN.read_text())
    return plan, site_dir / "site.toml"


def cli(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flare_diag.daemon.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def run_window(tmp: Path, python: Path, model: Path, blocks: int) -> tuple[int, dict, Path]:
    plan, site = write_site(tmp, python, model, blocks)
    out = tmp / "out"
    p = cli("run", "--plan", str(plan), "--site", str(site), "--out", str(out))
    assert (out / "report.json").exists(), p.stdout[-3000:] + p.stderr[-3000:]
    return p.returncode, json.loads((out / "report.json").read_text()), out


def cell(r: dict, phase: str) -> dict:
    return next(c for c in r["cells"] if c["phase"] == phase)
