"""The checkpoint (seq, head hash) kept outside the database so truncation is detectable."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import msgspec

MAC_DOMAIN = b"flare-diag.checkpoint/1\0"
CHECK_DOMAIN = b"flare-diag.checkpoint/2\0"
SLOT = 256  # bytes a slot: its JSON, padded with spaces, and a newline
FORMAT = "flare-diag.checkpoint/2"


class Checkpoint(msgspec.Struct, frozen=True):
    seq: int
    hash: str
    format: str = "flare-diag.checkpoint/1"
    # HMAC-SHA256 of (seq, hash) under a key from the unit's credentials: rewriting the chain and
    # its checkpoint then needs the key, not only write access to the state folder
    mac: str = ""
    # format 2: a digest of the slot's own fields, so that a slot torn by a crash mid-write (half the
    # new line over half the old) reads as no slot rather than as a checkpoint that never was
    check: str = ""


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


def _check(seq: int, hash_hex: str, mac: str) -> str:
    return hashlib.sha256(CHECK_DOMAIN + f"{seq}:{hash_hex}:{mac}".encode()).hexdigest()[:16]


def slot_line(seq: int, head_hash: bytes, key: bytes | None = None) -> bytes:
    """One slot: the checkpoint as a JSON line of exactly SLOT bytes."""
    mac = checkpoint_mac(key, seq, head_hash) if key else ""
    h = head_hash.hex()
    line = msgspec.json.encode(Checkpoint(seq=seq, hash=h, format=FORMAT, mac=mac, check=_check(seq, h, mac)))
    return line.ljust(SLOT - 1) + b"\n"


def write_checkpoint(path: Path, seq: int, head_hash: bytes, key: bytes | None = None) -> None:
    """Atomically replaces the whole checkpoint file (an archive's, a test's): one slot, by rename."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(slot_line(seq, head_hash, key))
    os.replace(tmp, path)


class CheckpointSlots:
    """The store's checkpoint file, held open and written in place after every commit.

    Replacing the file by rename after each commit (a new inode, a rename, ext4's flush of the
    replaced data) cost a single durable append about 40 % of its time. Two fixed-width slots are
    written in turn instead, each with one pwrite: the slot being overwritten is never the newest,
    so a crash mid-write leaves the other, one commit older, and the reader takes the newest slot
    that checks. Like the file it replaces, it is not fsynced: it may lag the log, never lead it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._next = 0

    def write(self, seq: int, head_hash: bytes, key: bytes | None = None) -> None:
        if self._fd is None and not _has_data(self.path):
            # the first slot of a new file arrives whole, by rename: a reader beside the writer (a
            # verify, a status) never meets a file with no complete slot in it
            write_checkpoint(self.path, seq, head_hash, key)
            self._open()
            return
        if self._fd is None:
            self._open()
        assert self._fd is not None
        os.pwrite(self._fd, slot_line(seq, head_hash, key), self._next * SLOT)
        self._next ^= 1

    def _open(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            size = os.fstat(fd).st_size
            if size == 2 * SLOT:  # overwrite the older slot first
                slots = [_slot(os.pread(fd, SLOT, k * SLOT)) for k in (0, 1)]
                seqs = [cp.seq if cp is not None else -1 for cp in slots]
                self._next = 0 if seqs[0] <= seqs[1] else 1
            else:  # one slot, an older build's single line (shorter than a slot) or nothing: never over it
                self._next = 1 if size else 0
                if size > 2 * SLOT:
                    os.ftruncate(fd, 2 * SLOT)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _has_data(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


def _slot(data: bytes) -> Checkpoint | None:
    """The checkpoint a slot holds, or None when it is torn, blank or not one."""
    try:
        cp = _decode(data.strip(b" \0\n"))
    except BadCheckpoint:
        return None
    return cp


class BadCheckpoint(ValueError):
    """The checkpoint file cannot be read as a flare-diag checkpoint."""


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The newest checkpoint the file holds (a slot file's newest slot that checks, or an older
    build's single line); None when there is no file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:  # a directory in its place, no permission
        raise BadCheckpoint(f"{path}: cannot read the checkpoint ({exc.strerror or exc})") from None
    found: list[Checkpoint] = []
    why: BadCheckpoint | None = None
    for line in data.split(b"\n"):
        line = line.strip(b" \0")  # a slot's padding; the hole before slot 1 of a file begun as one line
        if not line and found:
            continue
        try:
            found.append(_decode(line))
        except BadCheckpoint as exc:
            why = why or exc
    if not found:
        raise BadCheckpoint(f"{path}: {why}") from None
    return max(found, key=lambda cp: cp.seq)


def _decode(line: bytes) -> Checkpoint:
    try:
        cp = msgspec.json.decode(line, type=Checkpoint)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadCheckpoint(f"not a flare-diag checkpoint ({exc})") from None
    if not cp.format.startswith("flare-diag.checkpoint/"):
        raise BadCheckpoint(f"not a flare-diag checkpoint (format {cp.format!r})")
    try:
        if len(bytes.fromhex(cp.hash)) != 32 or cp.seq < 0:
            raise ValueError
    except ValueError:
        raise BadCheckpoint(f"not a flare-diag checkpoint (seq {cp.seq}, hash {cp.hash[:80]!r})") from None
    if cp.format != "flare-diag.checkpoint/1" and not hmac.compare_digest(cp.check, _check(cp.seq, cp.hash, cp.mac)):
        raise BadCheckpoint(f"a torn checkpoint slot (seq {cp.seq}: its check does not match)")
    return cp
