"""The daemon's fleet settings (a TOML file of its own, not the site profile) and the database's DSN."""

from __future__ import annotations

import os
import re
from pathlib import Path

import msgspec

CREDENTIAL = "fleet-password"  # the name systemd's LoadCredential= gives the password file
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class FleetError(ValueError):
    """The fleet settings or the database cannot be used as given (one line, for the operator)."""


class FleetConfig(msgspec.Struct, forbid_unknown_fields=True):
    dsn: str  # libpq connection string or URI, without a password
    host: str  # this host's id in the fleet
    pool: str  # the pool of primaries it belongs to
    password_file: str = ""  # else $CREDENTIALS_DIRECTORY/fleet-password when it exists, else none (peer/trust)
    batch: int = 2000  # events per shipped batch
    lease_timeout_s: float = 10.0  # a lease attempt that takes longer refuses the start


def names_password(dsn: str) -> bool:
    """Whether a DSN carries a password in any form libpq reads (key=value, or a URI's user:password@)."""
    from psycopg.conninfo import conninfo_to_dict
    try:
        return bool(conninfo_to_dict(dsn).get("password")) or "password" in dsn.lower()
    except Exception:  # noqa: BLE001 - one that does not parse is judged by its words
        return "password" in dsn.lower()


def check_name(what: str, value: str) -> str:
    if not _NAME.match(value or ""):
        raise FleetError(f"{what} {value!r}: expected 1-64 letters, digits, '.', '_' or '-'")
    return value


def load_config(path: Path) -> FleetConfig:
    try:
        cfg = msgspec.toml.decode(path.read_bytes(), type=FleetConfig)
    except OSError as exc:
        raise FleetError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FleetError(f"{path}: not a fleet file ({exc})") from None
    check_name("host", cfg.host)
    check_name("pool", cfg.pool)
    if not 1 <= cfg.batch <= 100_000:
        raise FleetError(f"{path}: batch {cfg.batch}: expected 1 to 100000 events")
    if names_password(cfg.dsn):
        raise FleetError(f"{path}: the dsn names a password; put it in a credential file (password_file or "
                         f"systemd LoadCredential={CREDENTIAL}:...) instead")
    return cfg


def conninfo(dsn: str, password_file: str = "") -> str:
    """The DSN with the password read from its credential file, if there is one (never logged)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:  # its words, never the DSN itself (it may hold what it should not)
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
    from psycopg.conninfo import conninfo_to_dict
    try:
        d = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - a DSN that does not parse is shown as nothing of it
        return "(unparsable dsn)"
    return " ".join(f"{k}={d[k]}" for k in ("host", "port", "dbname", "user") if d.get(k))
