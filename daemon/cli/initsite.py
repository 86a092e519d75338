"""`flare-diag init-site KIND DIR`: an annotated site profile and its token-file placeholders, and
`flare-diag share`: where the shipped units, templates, build script and documents lie."""

from __future__ import annotations

import os
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


def init_site(kind: str, folder: Path, name: str | None = None) -> tuple[Path, list[Path], list[Path]]:
    """Writes FOLDER/NAME.toml (never over an existing file) and, for each token file it names that
    does not exist yet, a placeholder readable by its owner only (0600). Returns the profile, the
    placeholders written and the token files left as they were."""
    text = template(kind)
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
    for svc in TOKEN_SERVICES:
        s = getattr(prof, svc)
        tf = getattr(s, "token_file", None) if s is not None else None
        if not tf or tf.startswith("credential:"):
            continue
        path = folder / tf
        if path.exists():
            kept.append(path)
            continue
        _write_new(path, (PLACEHOLDER_TOKEN + "\n").encode(), 0o600)
        written.append(path)
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
            "site_templates": str(resource("flare_diag.daemon", "templates")),
            "engine_build_script": str(resource("flare_diag.fixtures", "engines", "llamacpp", "build.sh"))}
