"""Where the service keeps its control socket and its state, and where the operator keeps the sites."""

from __future__ import annotations

import os
from pathlib import Path


def default_sites_dir() -> Path:
    return Path(os.environ.get("FLARE_DIAG_SITES", "/etc/flare-diag/sites"))


def default_socket() -> Path:
    rt = os.environ.get("RUNTIME_DIRECTORY")
    return Path(rt.split(":")[0]) / "control.sock" if rt else Path("/run/flare-diagd/control.sock")


def default_state_dir() -> Path:
    sd = os.environ.get("STATE_DIRECTORY")
    return Path(sd.split(":")[0]) if sd else Path("/var/lib/flare-diagd")
