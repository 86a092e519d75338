"""The site profile (TOML): where each service lives, its token file, and the metric-name map."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Literal

import msgspec


class Service(msgspec.Struct, forbid_unknown_fields=True):
    url: str
    token_file: str | None = None
    backend: str | None = None            # router
    candidate_recipe: str | None = None   # manager
    target: str | None = None             # monitoring


class Gpu(msgspec.Struct, forbid_unknown_fields=True):
    source: Literal["nvml", "sim", "none"] = "nvml"  # none: a CPU engine, no GPU to watch
    url: str | None = None
    token_file: str | None = None


class SteadyState(msgspec.Struct, forbid_unknown_fields=True):
    """The site's Prometheus, which the plan's steady-state guards query."""

    prometheus_url: str
    token_file: str | None = None


class LocalRecipeSpec(msgspec.Struct, forbid_unknown_fields=True):
    args: list[str]   # {model}, {port} and {host} are filled in (other braces are passed as written); the
                      # serving token goes in as --api-key-file (llama.cpp) or VLLM_API_KEY (vLLM)
    model: str        # relative to the profile: a file (llama.cpp's GGUF) or a folder (vLLM's Hugging Face model)
    env: dict[str, str] = {}  # the engine's environment on top of the daemon's (e.g. VLLM_CPU_KVCACHE_SPACE)


class Engine(msgspec.Struct, forbid_unknown_fields=True):
    """An engine the daemon runs itself as a local process (in place of a recipe manager service)."""

    binary: str                 # relative to the profile, absolute, or ${ENV_VAR}
    incumbent: str
    candidate_recipe: str
    recipes: dict[str, LocalRecipeSpec]
    # vllm: `binary` is the Python of vLLM's environment, the args start `-m vllm.entrypoints.openai.api_server`
    kind: Literal["llamacpp", "vllm"] = "llamacpp"
    load_timeout_s: float = 120.0
    log_dir: str = "engine-logs"


class Forecast(msgspec.Struct, forbid_unknown_fields=True):
    """Pace probing: off unless the site opts in. When on, the forecast sends at most this many of
    the plan's own bodies (never more than the plan's `rates.probe_requests`) to the incumbent
    before the window opens, and every one is written to the event log."""

    probe_requests: int = 0


class SiteProfile(msgspec.Struct, forbid_unknown_fields=True):
    serving: Service
    manager: Service | None = None
    engine: Engine | None = None
    router: Service | None = None
    monitoring: Service | None = None
    gpu: Gpu = msgspec.field(default_factory=Gpu)
    metrics_profile: Literal["flare", "llamacpp", "vllm", "sglang"] = "flare"
    metrics: dict[str, str] = {}  # contract family -> engine selector, on top of metrics_profile
    forecast: Forecast = msgspec.field(default_factory=Forecast)
    steady_state: SteadyState | None = None


class Site(msgspec.Struct):
    """A profile with its tokens read (tokens never leave this object: not logged, not reported)."""

    profile: SiteProfile
    tokens: dict[str, str]
    name: str
    sha256: str
    base_dir: Path = Path(".")
    token_files: dict[str, str] = {}  # service -> token file path (a path, never the token)
    profile_toml: str = ""  # the profile as read (paths and names, never a token): what a recovery restores with
    warnings: list[str] = []  # what the operator should fix, though the profile works (a world-readable token)
    # how the services are reached when not over the network: a rehearsal's in-process simulator
    # (an httpx transport); never encoded
    transport: Any = None

    def token_path(self, svc: str) -> Path | None:
        p = self.token_files.get(svc)
        return Path(p) if p else None

    @property
    def simulated(self) -> bool:
        """A simulated host (flaresim's GPUs): the only kind a window may run on a scaled clock."""
        return self.profile.gpu.source == "sim"

    @property
    def gpus_watched(self) -> bool:
        """Whether the site's GPUs can be watched at all (gpu.source is not "none")."""
        return self.profile.gpu.source != "none"

    @property
    def gpus_through_nvml(self) -> bool:
        """The host's own GPUs, read through NVML (the driver must be there)."""
        return self.profile.gpu.source == "nvml"

    @property
    def candidate_recipe(self) -> str:
        p = self.profile
        return (p.engine.candidate_recipe if p.engine else p.manager.candidate_recipe) or ""  # type: ignore[union-attr]  # a profile without an engine section has a manager section

    def __repr__(self) -> str:  # a Site may end up in a traceback or a log line; its tokens must not
        return f"Site(name={self.name!r}, sha256={self.sha256!r}, tokens=<{len(self.tokens)} hidden>)"


def scrub(text: str, secrets: object) -> str:
    """`text` with every loaded token's value replaced: a host that echoes a token back in an error
    body must not put it in a log, a report, a journal line or a terminal."""
    for value in sorted({v for v in secrets if v and len(v) >= 4}, key=len, reverse=True):  # type: ignore[attr-defined]  # secrets holds the loaded token strings
        text = text.replace(value, "[token]")
    return text


class SiteError(ValueError):
    pass


# the profile's sections that may name a token file
TOKEN_SERVICES = ("serving", "manager", "router", "monitoring", "gpu", "steady_state")
# what `flare-diag init-site` writes into a token file until the operator puts the real token there
PLACEHOLDER_TOKEN = "REPLACE-WITH-THE-SERVICE-TOKEN"


MAX_SITE_BYTES = 1 << 20  # a site profile is a few hundred bytes of TOML


def load_site(path: Path) -> Site:
    from flare_diag.daemon.hosts.files import FileRefused, read_bounded
    try:
        data = read_bounded(path, "the site profile", MAX_SITE_BYTES)
    except FileRefused as exc:
        raise SiteError(str(exc)) from None
    return site_from_bytes(data, path)


def site_from_bytes(data: bytes, path: Path) -> Site:
    """A profile's content as read from `path` (relative token files and models resolve against its folder)."""
    try:
        prof = msgspec.toml.decode(data, type=SiteProfile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SiteError(f"{path}: {exc}") from None
    except RecursionError:
        raise SiteError(f"{path}: nested too deeply to be a site profile") from None
    if (prof.manager is None) == (prof.engine is None):
        raise SiteError(f"{path}: expected exactly one of [manager] (a recipe manager service) and [engine] (a local engine)")
    if prof.manager is not None and not prof.manager.candidate_recipe:
        raise SiteError(f"{path}: manager.candidate_recipe: expected the candidate recipe's name")
    if prof.engine is not None:
        for name in (prof.engine.incumbent, prof.engine.candidate_recipe):
            if name not in prof.engine.recipes:
                raise SiteError(f"{path}: engine: no recipe {name!r} in [engine.recipes]")
    from flare_diag.policies.ranges import SITE_RANGES, out_of_range
    bad = out_of_range(msgspec.to_builtins(prof), SITE_RANGES)
    if bad is not None:
        where, value, rng = bad
        raise SiteError(f"{path}: {where} = {value!r}: expected " + (f"{rng.words()} ({rng.why})" if rng else "a finite number"))
    if prof.gpu.source == "sim" and not prof.gpu.url:
        raise SiteError(f"{path}: gpu.url: expected the simulator's URL when gpu.source = \"sim\"")
    tokens, token_files, warnings = _tokens(path, prof)
    if prof.engine is not None:
        _check_engine(path, prof.engine)
    _check_metrics(path, prof)
    _check_urls(path, prof)
    return Site(prof, tokens, path.stem, hashlib.sha256(data).hexdigest(), path.parent.resolve(), token_files,
                data.decode("utf-8", "replace"), warnings)


def _tokens(path: Path, prof: SiteProfile) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """Each service's token read from its file (a path beside the profile, or a systemd credential), the
    files' paths, and a warning for a file every user of the host may read."""
    tokens, token_files = {}, {}
    warnings: list[str] = []
    for name in TOKEN_SERVICES:
        svc = getattr(prof, name)
        if svc is None or svc.token_file is None:
            continue
        tf = _token_path(path, svc.token_file)
        if tf is None:
            raise SiteError(f"{path}: {name}.token_file {svc.token_file!r}: no $CREDENTIALS_DIRECTORY"
                            " (credential: names work under systemd's LoadCredential only)")
        try:
            tokens[name] = _read_token(tf)
            mode = tf.stat().st_mode
        except OSError as exc:
            raise SiteError(f"{path}: {name}.token_file {svc.token_file!r}: cannot read ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise SiteError(f"{path}: {name}.token_file {svc.token_file!r}: expected a text token") from None
        except ValueError as exc:
            raise SiteError(f"{path}: {name}.token_file {svc.token_file!r}: {exc}") from None
        if not tokens[name]:
            raise SiteError(f"{path}: {name}.token_file {svc.token_file!r}: is empty; expected the service's token")
        if tokens[name] == PLACEHOLDER_TOKEN:
            raise SiteError(f"{path}: {name}.token_file {svc.token_file!r}: still holds init-site's placeholder; "
                            "write the service's token in it")
        if mode & 0o004:
            warnings.append(f"{name}.token_file {svc.token_file!r} is readable by every user of this host "
                            f"(chmod o-r, or install it as a systemd credential)")
        token_files[name] = str(tf)
    return tokens, token_files, warnings


def _check_metrics(path: Path, prof: SiteProfile) -> None:
    """SiteError unless every [metrics] entry names a contract family and a selector that parses."""
    from flare_diag.daemon.hosts.metrics import contract_families, selector
    known = contract_families()
    for family, spec in prof.metrics.items():
        if family not in known:
            short = known.get(f"flare_{family}") or next((f for f, n in known.items() if n == family), None)
            raise SiteError(f"{path}: metrics.{family}: not a contract metric family; "
                            + (f"did you mean {short}? " if short else "")
                            + f"expected one of {', '.join(sorted(known))}")
        try:
            selector(spec)
        except ValueError as exc:
            raise SiteError(f"{path}: metrics.{family}: {exc}") from None


def _check_urls(path: Path, prof: SiteProfile) -> None:
    """SiteError unless every service's URL is http(s) with a host, of a bounded length."""
    for name in ("serving", "manager", "router", "monitoring"):
        svc = getattr(prof, name)
        if svc is not None and not _http_url(svc.url):
            raise SiteError(f"{path}: {name}.url {svc.url[:100]!r}: expected an http:// or https:// URL with a host, of at most {MAX_URL_CHARS} characters")
    if prof.steady_state is not None and not _http_url(prof.steady_state.prometheus_url):
        raise SiteError(f"{path}: steady_state.prometheus_url {prof.steady_state.prometheus_url[:100]!r}: expected an "
                        f"http:// or https:// URL with a host, of at most {MAX_URL_CHARS} characters")
    if prof.gpu.url is not None and not _http_url(prof.gpu.url):
        raise SiteError(f"{path}: gpu.url {prof.gpu.url[:100]!r}: expected an http:// or https:// URL with a host, of at most {MAX_URL_CHARS} characters")


MAX_TOKEN_BYTES = 4096
MAX_URL_CHARS = 2048


def _read_token(tf: Path) -> str:
    """A token file's text: a regular file of at most MAX_TOKEN_BYTES (`/dev/zero` or a FIFO would be
    read forever)."""
    import stat
    st = tf.stat()
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("expected a regular file")
    with tf.open("rb") as f:
        data = f.read(MAX_TOKEN_BYTES + 1)
    if len(data) > MAX_TOKEN_BYTES:
        raise ValueError(f"larger than {MAX_TOKEN_BYTES} bytes; expected a token")
    return data.decode().strip()


def _http_url(url: str) -> bool:
    if len(url) > MAX_URL_CHARS:
        return False
    from urllib.parse import urlsplit
    try:
        u = urlsplit(url)
        u.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError:
        return False
    if u.scheme not in ("http", "https") or not u.hostname:
        return False
    import httpx
    try:  # the client's own parse, stricter than urlsplit's: a host that is no IDNA name is refused here
        httpx.URL(url)
    except (httpx.InvalidURL, UnicodeError):
        return False
    return True


def _check_engine(path: Path, e: Engine) -> None:
    binary = Path(os.path.expandvars(e.binary))
    binary = binary if binary.is_absolute() else path.parent / binary
    if "$" in str(binary) or not os.access(binary, os.X_OK):
        raise SiteError(f"{path}: engine.binary {e.binary!r}: no executable at {binary}")
    for name, r in e.recipes.items():
        model = path.parent / r.model
        if e.kind == "vllm" and not (model / "config.json").is_file():
            raise SiteError(f"{path}: engine.recipes.{name}.model {r.model!r}: expected a model folder with a "
                            f"config.json (Hugging Face format)")
        if e.kind == "llamacpp" and not model.is_file():
            raise SiteError(f"{path}: engine.recipes.{name}.model {r.model!r}: no such file")


CREDENTIAL_PREFIX = "credential:"


def _token_path(profile: Path, token_file: str) -> Path | None:
    """A token file relative to the profile, or `credential:NAME` from systemd's $CREDENTIALS_DIRECTORY."""
    if token_file.startswith(CREDENTIAL_PREFIX):
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        return Path(creds) / token_file[len(CREDENTIAL_PREFIX):] if creds else None
    return profile.parent / token_file


def sim_site(base_url: str, token: str, candidate: str = "glm-candidate", transport: Any = None) -> Site:
    """The profile of an embedded flaresim: all services on one base URL, the router under /routed."""
    prof = SiteProfile(
        serving=Service(url=base_url), manager=Service(url=base_url, candidate_recipe=candidate),
        router=Service(url=f"{base_url}/routed", backend="primary"),
        monitoring=Service(url=base_url, target="primary"), gpu=Gpu(source="sim", url=base_url))
    data = msgspec.json.encode(prof)
    return Site(prof, {k: token for k in TOKEN_SERVICES}, "flaresim",
                hashlib.sha256(data).hexdigest(), transport=transport)
