"""The checkpoint line (seq, head hash) kept outside the database so truncation is detectable."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec


class Checkpoint(msgspec.Struct, frozen=True):
    seq: int
    hash: str
    format: str = "flare-diag.checkpoint/1"


def default_path(db_path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(db_path)}.checkpoint")


def write_checkpoint(path: Path, seq: int, head_hash: bytes) -> None:
    """Atomically replaces the checkpoint; it may lag the log, never lead it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgspec.json.encode(Checkpoint(seq=seq, hash=head_hash.hex())) + b"\n")
    os.replace(tmp, path)


class BadCheckpoint(ValueError):
    """The checkpoint file cannot be read as a flare-diag checkpoint."""


def read_checkpoint(path: Path) -> Checkpoint | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        cp = msgspec.json.decode(data, type=Checkpoint)
    except msgspec.DecodeError as exc:
        raise BadCheckpoint(f"{path}: not a flare-diag checkpoint ({exc})") from None
    if not cp.format.startswith("flare-diag.checkpoint/"):
        raise BadCheckpoint(f"{path}: not a flare-diag checkpoint (format {cp.format!r})")
    return cp
