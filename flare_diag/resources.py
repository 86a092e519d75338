"""Where the data shipped inside the installed packages lies (plans, fixtures, scenarios, units, docs)."""

from __future__ import annotations

from pathlib import Path


def resource(package: str, *parts: str) -> Path:
    """A file or folder shipped in `package`, as a path: the packages install as folders (never
    zipped), so importlib.resources gives real paths, wherever the package was installed from."""
    from importlib.resources import files  # a tenth of a CLI call's start-up: loaded when a file is wanted
    return Path(str(files(package))).joinpath(*parts)
