"""Reading an operator's file: a regular file of bounded size, or one clear line saying why not.

A plan path that is `/dev/zero` or a FIFO would block a read for ever, and a device or a huge file would
fill memory; every file a command or the daemon reads on an operator's word goes through here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class FileRefused(ValueError):
    """The path is not a regular file of at most the size allowed (the message names it and why)."""


def read_bounded(path: Path, what: str, limit: int) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes; FileRefused otherwise."""
    if "\0" in str(path):  # the kernel takes no such path, and printing it would cut the line short
        raise FileRefused(f"{str(path)!r}: cannot read {what} (a path holds no NUL byte)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a FIFO must not block the open
    except OSError as exc:
        raise FileRefused(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file"
            raise FileRefused(f"{path}: {what} is {kind}; expected a regular file")
        if st.st_size > limit:
            raise FileRefused(f"{path}: {what} is {st.st_size} bytes; expected at most {limit}")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > limit:  # it grew while read
                raise FileRefused(f"{path}: {what} grew past {limit} bytes while it was read")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise FileRefused(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
