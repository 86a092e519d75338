"""Where the data shipped inside the installed packages lies (plans, fixtures, scenarios, units, docs)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def resource(package: str, *parts: str) -> Path:
    """A file or folder shipped in `package`, as a path: the packages install as folders (never
    zipped), so importlib.resources gives real paths, wherever the package was installed from."""
    return Path(str(files(package))).joinpath(*parts)
