"""Preserved history (`[preserve] paths`): hashed before anything changes, checked after publishing.

The seed: "preserve wave-v1 and its hosted snapshot; preserve hosted historical report; create a new
dated report snapshot". A preserved path is a file or a folder (hashed as its sorted relative paths
and their files' hashes); a window refuses to start when one is missing or when its reports would be
written inside one, and says whether each is unchanged once its reports are out.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from flare_diag.events.schema import PreservedChecked

MAX_FILES = 100_000  # a preserved folder larger than this is refused: hashing it would hold a start for minutes


class PreserveError(ValueError):
    pass


def resolve(paths: list[str], base: Path | None) -> list[Path]:
    """The plan's preserved paths as absolute ones (relative to `base`, the plan's folder; None: the daemon,
    which has the plan's bytes only, so every path must be absolute)."""
    out = []
    for p in paths:
        path = Path(p).expanduser()
        if not path.is_absolute():
            if base is None:
                raise PreserveError(f"preserve.paths: {p!r}: expected an absolute path (a plan started over the "
                                    f"socket has no folder of its own)")
            path = base / path
        out.append(path.resolve())
    return out


def digest(path: Path) -> str | None:
    """A file's sha256, a folder's over its files (relative path and sha256, sorted); None when missing."""
    if path.is_file():
        return _file(path)
    if not path.is_dir():
        return None
    h = hashlib.sha256(b"flare-diag.preserve/1\n")
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    if len(files) > MAX_FILES:
        raise PreserveError(f"preserve: {path} holds over {MAX_FILES} files")
    for f in files:
        h.update(f"{f.relative_to(path).as_posix()}\0{_file(f)}\n".encode())
    return h.hexdigest()


def _file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def before(paths: list[Path], outputs: list[Path]) -> PreservedChecked:
    """Every preserved path hashed before anything changes; refuses a missing one, and reports that
    would be written inside one."""
    found = {}
    for p in paths:
        d = digest(p)
        if d is None:
            raise PreserveError(f"preserve.paths: {p} does not exist: a window cannot promise to leave it untouched")
        for out in outputs:
            o = out.resolve()
            if o == p or p in o.parents:
                raise PreserveError(f"preserve.paths: {p}: the window's reports would be written inside it ({o})")
        found[str(p)] = {"sha256": d}
    return PreservedChecked(when="before", paths=found)


def after(first: PreservedChecked) -> PreservedChecked:
    """The same paths hashed again, once the reports are published: each says whether it is unchanged."""
    out = {}
    for p, was in first.paths.items():
        try:
            now = digest(Path(p))
        except (OSError, PreserveError):
            now = None
        out[p] = {"sha256": now, "was": was["sha256"], "unchanged": now == was["sha256"]}
    return PreservedChecked(when="after_publishing", paths=out)
