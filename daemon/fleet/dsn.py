"""The fleet database's connection string: parsed as libpq parses it, refused where it names a password,
given the password from a credential file, shown without it. Free of psycopg and msgspec, so that a
reading command starts fast (issue 49)."""

from __future__ import annotations

import os
from pathlib import Path

CREDENTIAL = "fleet-password"  # the name systemd's LoadCredential= gives the password file
CONNECT_TIMEOUT_S = 5  # a fleet database that has not answered by then is said to be unreachable


class FleetError(ValueError):
    """The fleet settings or the database cannot be used as given (one line, for the operator)."""


def names_password(dsn: str) -> bool:
    """Whether a DSN carries a password in any form libpq reads (key=value, or a URI's user:password@)."""
    from flare_diag.daemon.fleet.libpq import conninfo_to_dict
    try:
        return bool(conninfo_to_dict(dsn).get("password")) or "password" in dsn.lower()
    except Exception:  # noqa: BLE001 - one that does not parse is judged by its words
        return "password" in dsn.lower()


def conninfo(dsn: str, password_file: str = "") -> str:
    """The DSN with the password read from its credential file, if there is one (never logged)."""
    from flare_diag.daemon.fleet.libpq import LibpqError, conninfo_to_dict, make_conninfo
    try:
        conninfo_to_dict(dsn)
    except LibpqError as exc:  # its words, never the DSN itself (it may hold what it should not)
        raise FleetError(f"the DSN does not parse as a libpq connection string or URI "
                         f"({' '.join(str(exc).split())[:120]})") from None
    if names_password(dsn):
        raise FleetError("the DSN names a password (key=value or in a URI); put it in a credential file instead")
    if os.environ.get("PGPASSWORD"):  # libpq's third form: it would send it, and it shows in /proc/PID/environ
        raise FleetError("PGPASSWORD is set in the environment; put the password in a credential file (password_file, "
                         f"or systemd LoadCredential={CREDENTIAL}:...) instead")
    path = Path(password_file) if password_file else None
    if path is None and os.environ.get("CREDENTIALS_DIRECTORY"):
        cand = Path(os.environ["CREDENTIALS_DIRECTORY"]) / CREDENTIAL
        path = cand if cand.exists() else None
    if path is None:
        return make_conninfo(dsn)
    try:
        password = path.read_text().strip()
    except OSError as exc:
        raise FleetError(f"{path}: the fleet password cannot be read ({exc.strerror or exc})") from None
    return make_conninfo(dsn, password=password)


def redact(dsn: str) -> str:
    """A DSN as it may be shown: host, port and database only."""
    from flare_diag.daemon.fleet.libpq import conninfo_to_dict
    try:
        d = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - a DSN that does not parse is shown as nothing of it
        return "(unparsable dsn)"
    return " ".join(f"{k}={d[k]}" for k in ("host", "port", "dbname", "user") if d.get(k))
