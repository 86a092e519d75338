"""libpq itself, through ctypes, for what must start fast (issue 49): parse a connection string and
run one reading statement as text. The fleet's other work goes through psycopg.

Why not psycopg here: importing it costs 6-8x a bare interpreter's start on this machine (its error
classes, `importlib.metadata`, asyncio), more than the whole budget of a reading command such as
`fleet status`. psycopg is itself a binding of this library, and its `conninfo_to_dict` is libpq's
PQconninfoParse; calling that and PQconnectdbParams/PQexecParams directly gives the same parsing, the same
connection (multi-host DSNs, `target_session_attrs`, TLS, passfiles) and the same server errors.
Where no libpq can be loaded, every function here falls back to psycopg: slower, never different.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys
from collections.abc import Sequence
from ctypes import POINTER, c_char_p, c_int, c_void_p

CONNECTION_OK = 0  # libpq-fe.h ConnStatusType
PGRES_TUPLES_OK = 2  # libpq-fe.h ExecStatusType


class LibpqError(ValueError):
    """libpq refused a connection string, a connection or a statement; the message is libpq's own."""


class _ConninfoOption(ctypes.Structure):
    """libpq-fe.h PQconninfoOption."""
    _fields_ = [("keyword", c_char_p), ("envvar", c_char_p), ("compiled", c_char_p), ("val", c_char_p),
                ("label", c_char_p), ("dispchar", c_char_p), ("dispsize", c_int)]


_SIGNATURES = {  # name: (restype, argtypes), from libpq-fe.h
    "PQconninfoParse": (POINTER(_ConninfoOption), [c_char_p, POINTER(c_void_p)]),
    "PQconninfoFree": (None, [POINTER(_ConninfoOption)]),
    "PQfreemem": (None, [c_void_p]),
    "PQconnectdbParams": (c_void_p, [POINTER(c_char_p), POINTER(c_char_p), c_int]),
    "PQstatus": (c_int, [c_void_p]),
    "PQerrorMessage": (c_char_p, [c_void_p]),
    "PQfinish": (None, [c_void_p]),
    "PQexecParams": (c_void_p, [c_void_p, c_char_p, c_int, c_void_p, POINTER(c_char_p), c_void_p, c_void_p, c_int]),
    "PQresultStatus": (c_int, [c_void_p]),
    "PQresultErrorMessage": (c_char_p, [c_void_p]),
    "PQntuples": (c_int, [c_void_p]),
    "PQnfields": (c_int, [c_void_p]),
    "PQgetisnull": (c_int, [c_void_p, c_int, c_int]),
    "PQgetvalue": (c_char_p, [c_void_p, c_int, c_int]),
    "PQclear": (None, [c_void_p]),
}
_lib: ctypes.CDLL | None = None
_looked = False


def _candidates() -> list[str]:
    """The libpq psycopg itself uses, in its own order: the copy its binary wheel carries, else the system's."""
    names = []
    for folder in sys.path:
        libs = os.path.join(folder or ".", "psycopg_binary.libs")
        if os.path.isdir(libs):
            names += [os.path.join(libs, f) for f in sorted(os.listdir(libs)) if f.startswith("libpq")]
    return names + ["libpq.so.5", "libpq.5.dylib"]


def library() -> ctypes.CDLL | None:
    """libpq with its functions typed, or None where none loads (then psycopg does the work)."""
    global _lib, _looked
    if not _looked:
        _looked = True
        for name in _candidates():
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                continue
            for fn, (restype, argtypes) in _SIGNATURES.items():
                getattr(lib, fn).restype, getattr(lib, fn).argtypes = restype, argtypes
            _lib = lib
            break
    return _lib


def _text(raw: bytes | None) -> str:
    return " ".join((raw or b"").decode("utf-8", "replace").split())


def conninfo_to_dict(dsn: str) -> dict[str, str]:
    """The parameters a connection string or URI sets, as libpq parses them; LibpqError if it does not."""
    lib = library()
    if lib is None:
        return _psycopg_parse(dsn)
    err = c_void_p()
    opts = lib.PQconninfoParse(dsn.encode(), ctypes.byref(err))
    if not opts:
        msg = ctypes.cast(err, c_char_p).value if err.value else b"out of memory"
        if err.value:
            lib.PQfreemem(err)
        raise LibpqError(_text(msg))
    try:
        out, i = {}, 0
        while opts[i].keyword is not None:
            if opts[i].val is not None:
                out[opts[i].keyword.decode()] = opts[i].val.decode()
            i += 1
        return out
    finally:
        lib.PQconninfoFree(opts)


def _psycopg_parse(dsn: str) -> dict[str, str]:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict as parse
    try:
        return {k: str(v) for k, v in parse(dsn).items()}
    except psycopg.ProgrammingError as exc:
        raise LibpqError(_text(str(exc).encode())) from None


_NEEDS_QUOTES = re.compile(r"[\s'\\]")


def make_conninfo(dsn: str, **params: str) -> str:
    """`dsn` with `params` set over it, as one key=value string libpq parses back to the same; `dsn`
    itself, checked, when there are none."""
    parsed = conninfo_to_dict(dsn)
    if not params:
        return dsn

    def quoted(v: str) -> str:  # libpq's rule: quote empty values and blanks; escape ' and \ with \
        v = v.replace("\\", "\\\\").replace("'", "\\'")
        return f"'{v}'" if not v or _NEEDS_QUOTES.search(v) else v
    return " ".join(f"{k}={quoted(v)}" for k, v in {**parsed, **params}.items())


def fetch_text(dsn: str, sql: str, connect_timeout_s: int, params: Sequence[str] = ()) -> list[list[str | None]]:
    """The rows of one statement (`params` for its $1, $2, ..., as text), each value as the server's text
    (None for NULL). Blocking: for a command with nothing else to do. Ctrl-C ends the process at once, as
    nothing it holds can be lost."""
    lib = library()
    if lib is None:
        raise LibpqError("no libpq could be loaded")
    keys = (c_char_p * 4)(b"dbname", b"connect_timeout", b"client_encoding", None)
    values = (c_char_p * 4)(dsn.encode(), str(connect_timeout_s).encode(), b"UTF8", None)
    try:  # libpq retries an interrupted wait, so Python's handler would never run
        previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    except ValueError:  # not the main thread: its signals are not ours to change
        previous = None
    conn = lib.PQconnectdbParams(keys, values, 1)  # 1: the dbname value is a whole DSN, expanded
    try:
        if not conn or lib.PQstatus(conn) != CONNECTION_OK:
            raise LibpqError(f"cannot connect ({_text(lib.PQerrorMessage(conn) if conn else b'out of memory')})")
        values_in = (c_char_p * max(len(params), 1))(*(p.encode() for p in params))
        return _rows(lib, lib.PQexecParams(conn, sql.encode(), len(params), None, values_in, None, None, 0))
    finally:
        lib.PQfinish(conn)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _rows(lib: ctypes.CDLL, res: int | None) -> list[list[str | None]]:
    try:
        if not res or lib.PQresultStatus(res) != PGRES_TUPLES_OK:
            raise LibpqError(_text(lib.PQresultErrorMessage(res) if res else b"no result"))
        return [[None if lib.PQgetisnull(res, r, c) else lib.PQgetvalue(res, r, c).decode()
                 for c in range(lib.PQnfields(res))] for r in range(lib.PQntuples(res))]
    finally:
        lib.PQclear(res)
