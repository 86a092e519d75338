"""The daemon's fleet settings: a TOML file of its own, not the site profile."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from flare_diag.daemon.fleet.dsn import CREDENTIAL, FleetError, names_password

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class FleetConfig(msgspec.Struct, forbid_unknown_fields=True):
    dsn: str  # libpq connection string or URI, without a password
    host: str  # this host's id in the fleet
    pool: str  # the pool of primaries it belongs to
    password_file: str = ""  # else $CREDENTIALS_DIRECTORY/fleet-password when it exists, else none (peer/trust)
    batch: int = 2000  # events per shipped batch
    lease_timeout_s: float = 10.0  # a lease attempt that takes longer refuses the start


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
