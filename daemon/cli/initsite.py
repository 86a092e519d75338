"""`flare-diag init-site KIND DIR`: an annotated site profile and its token-file placeholders, and
`flare-diag share`: where the shipped units, templates, build script and documents lie."""

from __future__ import annotations

import os
import re
from pathlib import Path

import msgspec

from flare_diag.daemon.hosts.site import PLACEHOLDER_TOKEN, TOKEN_SERVICES, SiteProfile
from flare_diag.daemon.window.setup import SITE_NAME, InputError
from flare_diag.resources import resource

KINDS = ("flare", "vllm", "sglang", "llamacpp")


def template(kind: str) -> str:
    if kind not in KINDS:
        raise InputError(f"init-site {kind!r}: expected one of {', '.join(KINDS)}")
    return resource("flare_diag.daemon", "templates", f"{kind}.toml").read_text()


CREDENTIALS_DIR = Path("/etc/flare-diag/credentials")
DROPIN_DIR = Path("/etc/systemd/system/flare-diagd.service.d")


def credential_name(site: str, svc: str) -> str:
    return f"{site}.{svc}.token"


def systemd_dropin(site: str, services: list[str], credentials_dir: Path = CREDENTIALS_DIR) -> str:
    """The unit's drop-in for one site: a LoadCredential= line for each token the site's profile names,
    and no other (a site without a router or monitoring needs no file for them)."""
    lines = [f"# flare-diagd.service.d/site-{site}.conf, written by `flare-diag init-site --systemd`:",
             f"# the tokens of site {site}; each file root-owned, mode 0600, under {credentials_dir}.",
             "[Service]"]
    lines += [f"LoadCredential={credential_name(site, s)}:{credentials_dir / credential_name(site, s)}" for s in services]
    return "\n".join(lines) + "\n"


def init_site(kind: str, folder: Path, name: str | None = None, systemd: bool = False,
              credentials_dir: Path = CREDENTIALS_DIR) -> tuple[Path, list[Path], list[Path]]:
    """Writes FOLDER/NAME.toml (never over an existing file) and, for each token file it names that
    does not exist yet, a placeholder readable by its owner only (0600). Returns the profile, the
    placeholders written and the token files left as they were.

    `systemd`: the profile names its tokens as systemd credentials (`credential:NAME.SERVICE.token`),
    the placeholders go to `credentials_dir` under those names, and FOLDER/NAME.flare-diagd.conf is the
    unit's drop-in with exactly the LoadCredential= lines this site needs."""
    text = template(kind)
    site = name or kind
    if systemd:
        text = re.sub(r'token_file = "([a-z]+)\.token"',
                      lambda m: f'token_file = "credential:{credential_name(site, m.group(1))}"', text)
    if name is not None and not SITE_NAME.fullmatch(name):
        raise InputError(f"--name {name[:80]!r}: expected a site name (letters, digits, '.', '_', '-'; no '/'): "
                         f"init-site writes only inside {folder}")
    profile = folder / f"{name or kind}.toml"
    if profile.exists():
        raise InputError(f"{profile}: already exists; init-site never overwrites a profile (choose --name or another DIR)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write_new(profile, text.encode(), 0o644)
    except OSError as exc:
        raise InputError(f"{profile}: cannot write ({exc.strerror})") from None
    prof = msgspec.toml.decode(text.encode(), type=SiteProfile)
    written, kept = [], []
    services = []
    for svc in TOKEN_SERVICES:
        s = getattr(prof, svc)
        tf = getattr(s, "token_file", None) if s is not None else None
        if not tf:
            continue
        if tf.startswith("credential:"):
            if not systemd:
                continue
            services.append(svc)
            path = credentials_dir / tf[len("credential:"):]
            try:
                credentials_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise InputError(f"{credentials_dir}: cannot create ({exc.strerror})") from None
        else:
            path = folder / tf
        if path.exists():
            kept.append(path)
            continue
        _write_new(path, (PLACEHOLDER_TOKEN + "\n").encode(), 0o600)
        written.append(path)
    if systemd:
        dropin = folder / f"{site}.flare-diagd.conf"
        if dropin.exists():
            kept.append(dropin)
        else:
            _write_new(dropin, systemd_dropin(site, services, credentials_dir).encode(), 0o644)
            written.append(dropin)
    return profile, written, kept


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        os.write(fd, data)
    finally:
        os.close(fd)


def shared_files() -> dict[str, str]:
    """What an operator installs besides the code, where this installation keeps it."""
    return {"systemd": str(resource("flare_diag.share.systemd")), "docs": str(resource("flare_diag.share.docs")),
            "host_api": str(resource("flare_diag.share.docs", "host-api.md")),
            "site_templates": str(resource("flare_diag.daemon", "templates")),
            "plans": str(resource("flare_diag.fixtures", "plans")),
            "engine_build_script": str(resource("flare_diag.fixtures", "engines", "llamacpp", "build.sh"))}
