"""The checkpoint line (seq, head hash) kept outside the database so truncation is detectable."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import msgspec

MAC_DOMAIN = b"flare-diag.checkpoint/1\0"


class Checkpoint(msgspec.Struct, frozen=True):
    seq: int
    hash: str
    format: str = "flare-diag.checkpoint/1"
    # HMAC-SHA256 of (seq, hash) under a key from the unit's credentials: rewriting the chain and
    # its checkpoint then needs the key, not only write access to the state folder
    mac: str = ""


def default_path(db_path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(db_path)}.checkpoint")


def checkpoint_mac(key: bytes, seq: int, head_hash: bytes) -> str:
    return hmac.new(key, MAC_DOMAIN + seq.to_bytes(8, "big") + head_hash, hashlib.sha256).hexdigest()


def mac_ok(cp: Checkpoint, key: bytes) -> bool:
    try:
        want = checkpoint_mac(key, cp.seq, bytes.fromhex(cp.hash))
    except ValueError:
        return False
    return hmac.compare_digest(want, cp.mac)


def write_checkpoint(path: Path, seq: int, head_hash: bytes, key: bytes | None = None) -> None:
    """Atomically replaces the checkpoint; it may lag the log, never lead it."""
    tmp = path.with_name(path.name + ".tmp")
    mac = checkpoint_mac(key, seq, head_hash) if key else ""
    tmp.write_bytes(msgspec.json.encode(Checkpoint(seq=seq, hash=head_hash.hex(), mac=mac)) + b"\n")
    os.replace(tmp, path)


class BadCheckpoint(ValueError):
    """The checkpoint file cannot be read as a flare-diag checkpoint."""


def read_checkpoint(path: Path) -> Checkpoint | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:  # a directory in its place, no permission
        raise BadCheckpoint(f"{path}: cannot read the checkpoint ({exc.strerror or exc})") from None
    try:
        cp = msgspec.json.decode(data, type=Checkpoint)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadCheckpoint(f"{path}: not a flare-diag checkpoint ({exc})") from None
    if not cp.format.startswith("flare-diag.checkpoint/"):
        raise BadCheckpoint(f"{path}: not a flare-diag checkpoint (format {cp.format!r})")
    try:
        if len(bytes.fromhex(cp.hash)) != 32 or cp.seq < 0:
            raise ValueError
    except ValueError:
        raise BadCheckpoint(f"{path}: not a flare-diag checkpoint (seq {cp.seq}, hash {cp.hash[:80]!r})") from None
    return cp
