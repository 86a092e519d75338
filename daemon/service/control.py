"""The control protocol: one JSON object per line over a unix socket, commands as a tagged union."""

from __future__ import annotations

import socket
import struct
from typing import Literal, Union

import msgspec

MAX_LINE = 256 * 1024       # a command line longer than this is refused and the connection closed (a plan travels in it)
MAX_REPLY_LINE = 256 << 20  # replies (a report) may be long; the client reads up to this much per line


class Status(msgspec.Struct, tag_field="cmd", tag="status", forbid_unknown_fields=True):
    pass


class Start(msgspec.Struct, tag_field="cmd", tag="start", forbid_unknown_fields=True):
    """The caller's own files travel as content, read by the client with the caller's rights; the
    daemon reads only what its operator installed. A site is a name in the daemon's sites directory,
    never a path: a socket-group member cannot point the daemon's tokens at a URL of its choosing."""

    plan_toml: str             # the plan's bytes, as the client read them
    site: str                  # a site profile's name in the daemon's sites directory
    plan_label: str = ""       # where the client read the plan (for messages only; never opened)
    time_scale: float = 1.0
    calibration: dict = {}     # computed by the client from an earlier log it can read
    accept_partial: bool = False
    # fixture name -> the folder the caller found it in beside the plan (for messages only; never
    # opened: the daemon reads fixtures from its own sites directory and its built-ins)
    caller_fixtures: dict[str, str] = {}


class Abort(msgspec.Struct, tag_field="cmd", tag="abort", forbid_unknown_fields=True):
    reason: str


class Watch(msgspec.Struct, tag_field="cmd", tag="watch", forbid_unknown_fields=True):
    from_seq: int | None = None  # None: from the start of the current (or last) window


class Report(msgspec.Struct, tag_field="cmd", tag="report", forbid_unknown_fields=True):
    window_id: str
    format: Literal["json", "md", "html"] = "json"


class Archive(msgspec.Struct, tag_field="cmd", tag="archive", forbid_unknown_fields=True):
    """Move the windows closed before `before` (YYYY-MM-DD, UTC) out of the daemon's log into a dated
    archive log under its state directory (no caller-named path: the daemon writes only its own folders)."""

    before: str


class ReviewSign(msgspec.Struct, tag_field="cmd", tag="review_sign", forbid_unknown_fields=True):
    """A review of a plan's bytes, recorded in the daemon's log with the caller's uid (the client hashed
    the plan and its fixtures' manifests; the daemon checks them again when a start names that plan)."""

    plan_name: str
    plan_sha256: str
    author: str
    fixtures: dict[str, str]
    by: str
    note: str = ""


class ReviewList(msgspec.Struct, tag_field="cmd", tag="review_list", forbid_unknown_fields=True):
    pass


Command = Union[Status, Start, Abort, Watch, Report, Archive, ReviewSign, ReviewList]
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
    except RecursionError:  # a field that takes any JSON (a start's calibration) nested past the decoder
        raise BadCommand("bad command: its JSON is nested deeper than a decoder reads") from None


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
