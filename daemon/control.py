"""The control protocol: one JSON object per line over a unix socket, commands as a tagged union."""

from __future__ import annotations

import socket
import struct
from typing import Literal, Union

import msgspec

MAX_LINE = 64 * 1024        # a command line longer than this is refused and the connection closed
MAX_REPLY_LINE = 256 << 20  # replies (a report) may be long; the client reads up to this much per line


class Status(msgspec.Struct, tag_field="cmd", tag="status", forbid_unknown_fields=True):
    pass


class Start(msgspec.Struct, tag_field="cmd", tag="start", forbid_unknown_fields=True):
    plan: str
    site: str
    time_scale: float = 1.0
    calibrate: str = ""  # an earlier window's log, read by the daemon
    accept_partial: bool = False


class Abort(msgspec.Struct, tag_field="cmd", tag="abort", forbid_unknown_fields=True):
    reason: str


class Watch(msgspec.Struct, tag_field="cmd", tag="watch", forbid_unknown_fields=True):
    from_seq: int | None = None  # None: from the start of the current (or last) window


class Report(msgspec.Struct, tag_field="cmd", tag="report", forbid_unknown_fields=True):
    window_id: str
    format: Literal["json", "md", "html"] = "json"


Command = Union[Status, Start, Abort, Watch, Report]
_decoder = msgspec.json.Decoder(Command)
_encoder = msgspec.json.Encoder()


class BadCommand(ValueError):
    """A line that is not one known command; the reply says why and nothing changes."""


def decode_command(line: bytes) -> Command:
    try:
        return _decoder.decode(line)
    except msgspec.ValidationError as exc:
        raise BadCommand(f"bad command: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadCommand(f"bad command: not a JSON object ({exc})") from None


def encode_command(cmd: Command) -> bytes:
    return _encoder.encode(cmd) + b"\n"


def reply(ok: bool = True, **fields: object) -> bytes:
    return _encoder.encode({"ok": ok, **fields}) + b"\n"


def error(message: str, **fields: object) -> bytes:
    return reply(False, error=message, **fields)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a unix socket (Linux SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)
