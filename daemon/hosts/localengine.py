"""The lifecycle of an engine the daemon runs itself as a local process (llama.cpp's llama-server, vLLM).

A recipe is the engine's command line, its environment and its model (a file, or a folder of files
for vLLM); its bytes (canonical JSON of the engine kind, the argument template, the environment and
the model's SHA-256) are what is hashed and compared. Load starts the process and waits for
`/health`; unload stops it (SIGTERM to its process group, then SIGKILL after a grace period).
Identity is the recipe hash, the model's SHA-256 and what the engine says of itself (llama.cpp's
`/props`; vLLM's `/version`, `/v1/models` and its `vllm:cache_config_info`).

The serving token reaches llama-server as `--api-key-file` and vLLM as `VLLM_API_KEY` in its
environment (never on a command line, which any user of the machine can read).

The engine runs in its own session, so a daemon killed with SIGKILL leaves it running. Its pid is
kept in `engine.pid` beside the engine logs: the next daemon stops that orphan before it starts
anything, and never starts an engine on a port something else already listens on (its `/health`
would be taken for the new engine's).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import json
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from flare_diag.daemon.hosts.errors import ActionFailed, answer_object
from flare_diag.daemon.hosts.httpclient import host_client

STOP_GRACE_S = 10.0
PIDFILE = "engine.pid"


def checked_off_loop(path: Path) -> concurrent.futures.Future[str]:
    """`file_sha256(path)` on a thread of its own, as a future that outlives whoever gave up waiting on it:
    a model on a mount that stopped answering blocks its read for good, and the engine's state says
    `busy` while it does (a daemon thread: a read that never returns does not hold the daemon's exit)."""
    fut: concurrent.futures.Future[str] = concurrent.futures.Future()
    fut.set_running_or_notify_cancel()  # running from here: a waiter that gives up cannot mark it done

    def run() -> None:
        try:
            fut.set_result(file_sha256(path))
        except BaseException as exc:  # handed to whoever awaits the future, as to_thread would
            fut.set_exception(exc)
    threading.Thread(target=run, name=f"sha256 {path.name}", daemon=True).start()
    return fut


def file_sha256(path: Path) -> str:
    """A file's SHA-256; a folder's is that of each file's relative path and SHA-256, in path order."""
    if path.is_dir():
        listing = "".join(f"{p.relative_to(path)}\0{file_sha256(p)}\n" for p in sorted(path.rglob("*")) if p.is_file())
        return hashlib.sha256(listing.encode()).hexdigest()
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


_PLACEHOLDER = re.compile(r"\{(model|port|host)\}")
ENGINE_NAMES = {"llamacpp": "llama-server", "vllm": "vllm"}  # the name a recipe's bytes carry


class LocalRecipe:
    def __init__(self, name: str, args: list[str], model: Path, env: dict[str, str] | None = None,
                 kind: str = "llamacpp") -> None:
        self.name = name
        self.args = args
        self.model = model
        self.env = env or {}
        self.kind = kind
        self.model_sha256 = ""
        self.content = b""
        self.sha256 = ""

    def hash(self) -> None:
        """Reads the model (GBs): call it on a worker thread, never on the event loop."""
        self.model_sha256 = file_sha256(self.model)
        body: dict = {"engine": ENGINE_NAMES[self.kind], "args": self.args, "model_sha256": self.model_sha256}
        if self.env:  # a llama.cpp recipe of an earlier build keeps its bytes
            body["env"] = self.env
        self.content = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        self.sha256 = hashlib.sha256(self.content).hexdigest()

    def host_tier(self) -> bool:
        """Whether the recipe gives the engine a tier behind its own cache: llama.cpp's host-RAM prompt
        cache (on unless --cache-ram 0), vLLM's KV connector (--kv-transfer-config). Configuration, not
        a counter's presence: a plain vLLM exports its connector counters as 0 all the same."""
        if self.kind == "vllm":
            return "--kv-transfer-config" in self.args
        return self.host_cache_bytes() != 0

    def host_cache_bytes(self) -> int | None:
        """--cache-ram N (MiB) as bytes; 0 for a vLLM recipe with no KV connector; None when unknown."""
        if self.kind == "vllm":
            return None if self.host_tier() else 0
        if "--cache-ram" in self.args:
            return int(self.args[self.args.index("--cache-ram") + 1]) << 20
        return None


class LocalEngine:
    """One engine process at a time, on the serving URL's port; the site's manager for local engines."""

    def __init__(self, binary: Path, recipes: dict[str, LocalRecipe], incumbent: str, serving_url: str,
                 api_key_file: Path | None, log_dir: Path, load_timeout_s: float = 120.0) -> None:
        self.binary = binary
        self.recipes = recipes
        self.incumbent = incumbent
        u = urlparse(serving_url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.url = serving_url.rstrip("/")
        self.api_key_file = api_key_file
        self.log_dir = log_dir
        self.load_timeout_s = load_timeout_s
        self.proc: asyncio.subprocess.Process | None = None
        self.loaded: LocalRecipe | None = None
        self.incarnation = 0
        self._prepared = False
        self._hashed = False
        self._checking: concurrent.futures.Future[str] | None = None  # the last load's model check
        self.reaped: str | None = None
        # no connection is kept between reads: the engine is restarted under the same address (a load,
        # an unload) and its HTTP server closes idle connections after a few seconds (uvicorn's 5 s
        # keep-alive), so a pooled one could be closed under the next read ("Server disconnected
        # without sending a response"); a loopback connect per read costs well under a millisecond
        self._client = host_client(timeout=10.0, limits=httpx.Limits(max_keepalive_connections=0))

    async def _ready(self) -> None:
        """Every recipe's identity (its model's hash), computed once, off the event loop."""
        if not self._hashed:
            await asyncio.to_thread(self._hash_recipes)
            self._hashed = True

    def _hash_recipes(self) -> None:
        for r in self.recipes.values():
            r.hash()

    async def prepare(self) -> None:
        """The host as a window finds it: the incumbent running, started once, before anything else."""
        await self._ready()
        if not self._prepared:
            self._prepared = True
            self.reaped = await self._stop_orphan()
            await self._start(self.recipes[self.incumbent])

    async def _stop_orphan(self) -> str | None:
        """Stops the engine an earlier daemon started and could not stop (it was killed); says so."""
        pf = self.log_dir / PIDFILE
        try:
            pid = int(pf.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            argv = []
        if not argv or argv[0] != str(self.binary) or str(self.port) not in argv:
            pf.unlink(missing_ok=True)  # gone, or the pid now belongs to something that is not our engine
            return None
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + STOP_GRACE_S
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if not Path(f"/proc/{pid}").exists():
                break
        pf.unlink(missing_ok=True)
        return f"stopped engine pid {pid}, left running by an earlier daemon"

    def _argv(self, r: LocalRecipe) -> list[str]:
        subst = {"model": str(r.model), "port": str(self.port), "host": self.host}
        # only the three placeholders are filled in: an argument's other braces (a JSON config such as
        # vLLM's --kv-transfer-config) are the engine's, passed as written
        argv = [str(self.binary)] + [_PLACEHOLDER.sub(lambda m: subst[m.group(1)], a) for a in r.args]
        if self.api_key_file is not None and r.kind == "llamacpp":
            argv += ["--api-key-file", str(self.api_key_file)]
        return argv

    def _env(self, r: LocalRecipe) -> dict[str, str]:
        env = {**os.environ, **r.env}
        if self.api_key_file is not None and r.kind == "vllm":
            try:
                env["VLLM_API_KEY"] = self.api_key_file.read_text().strip()
            except OSError as exc:
                raise ActionFailed("load_failed", f"engine {r.name}: serving token {self.api_key_file}: "
                                                  f"{exc.strerror}") from None
        return env

    def host_tier(self) -> bool:
        """Whether any of the site's recipes gives the engine a host tier (LocalRecipe.host_tier)."""
        return any(r.host_tier() for r in self.recipes.values())

    def resident_bytes(self) -> int | None:
        """The resident memory of the engine's whole process group (vLLM's API server, engine core and
        workers, which hold the KV cache, are separate processes); None when no engine runs."""
        if self.proc is None or self.proc.returncode is not None:
            return None
        return process_group_rss(self.proc.pid)

    async def _start(self, r: LocalRecipe) -> None:
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # e.g. beside a site profile under /etc, read-only to the service
            raise ActionFailed("load_failed", f"engine {r.name}: engine log folder {self.log_dir}: {exc.strerror}; "
                                              f"set [engine] log_dir to a writable folder") from None
        if _port_taken(self.host, self.port):
            raise ActionFailed("load_failed", f"engine {r.name}: {self.host}:{self.port} is already taken by another "
                                              f"process; a second engine is not started on it")
        self.incarnation += 1
        log_path = self.log_dir / f"engine-{self.incarnation}-{r.name}.log"
        log = log_path.open("ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(*self._argv(r), stdout=log, stderr=asyncio.subprocess.STDOUT,
                                                             stdin=asyncio.subprocess.DEVNULL, start_new_session=True,
                                                             env=self._env(r))
        except OSError as exc:
            raise ActionFailed("load_failed", f"engine {r.name}: cannot start {self.binary.name} ({exc.strerror})") from None
        finally:
            log.close()
        (self.log_dir / PIDFILE).write_text(f"{self.proc.pid}\n")
        deadline = time.monotonic() + self.load_timeout_s
        while time.monotonic() < deadline:
            if self.proc.returncode is not None:
                raise ActionFailed("load_failed", f"engine {r.name} exited with status {self.proc.returncode} while loading"
                                                  f"{self._last_words(log_path)}")
            try:
                if (await self._client.get(f"{self.url}/health")).status_code == 200:
                    self.loaded = r
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
        await self._stop()
        raise ActionFailed("load_failed", f"engine {r.name} was not healthy within {self.load_timeout_s:g} s")

    def _last_words(self, log_path: Path) -> str:
        """'; its log LOG ends: LINE' (its last line, 200 characters at most, the serving token scrubbed): why an
        engine exited is in its own words there, and the operator reads the rest of it there."""
        try:
            with log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return f"; its log {log_path}"
        last = " ".join(lines[-1].split())[:200] if lines else "(empty)"
        try:
            token = self.api_key_file.read_text().strip() if self.api_key_file is not None else ""
        except OSError:
            token = ""
        return f"; its log {log_path} ends: {last.replace(token, '***') if token else last}"

    async def _stop(self) -> None:
        p, self.proc, self.loaded = self.proc, None, None
        if p is None:
            return
        if p.returncode is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    await asyncio.wait_for(p.wait(), STOP_GRACE_S)
                except TimeoutError:
                    os.killpg(p.pid, signal.SIGKILL)
                    await p.wait()
            except ProcessLookupError:
                pass
        (self.log_dir / PIDFILE).unlink(missing_ok=True)

    def _recipe(self, name: str, sha256: str | None) -> LocalRecipe:
        r = self.recipes.get(name)
        if r is None:
            raise ActionFailed("not_found", f"no recipe {name!r}")
        if sha256 is not None and sha256 != r.sha256:
            raise ActionFailed("identity_drift", f"recipe {name!r}: sha256 does not match its bytes")
        return r

    # --- the manager's operations, in the shape of contract section 1 --------------------

    async def state(self) -> dict:
        await self._ready()
        await self.prepare()
        note = {"note": self.reaped} if self.reaped else {}
        # a model check still reading (a load its caller gave up on, on a mount that stopped answering)
        checking = self._checking is not None and not self._checking.done()
        if self.loaded is None or self.proc is None or self.proc.returncode is not None:
            # a process still running that never answered healthy: a load still starting, or one its caller
            # gave up on (the next load stops it first); either way, not a host at rest
            starting = self.proc is not None and self.proc.returncode is None
            return {"loaded": None, "busy": starting or checking, **note}
        return {"loaded": {"recipe": self.loaded.name, "sha256": self.loaded.sha256,
                           "incarnation": str(self.incarnation)}, **({"busy": True} if checking else {}), **note}

    async def recipe(self, name: str) -> dict:
        await self._ready()
        r = self._recipe(name, None)
        return {"name": name, "sha256": r.sha256, "content_b64": base64.b64encode(r.content).decode()}

    async def preview(self, op: str, name: str, sha256: str | None) -> dict:
        await self._ready()
        self._recipe(name, sha256)  # a preview of an unknown recipe, or of other bytes, fails as the load would
        steps = ["stop the process (TERM, then KILL)"] if op == "unload" else \
            ["verify the model's sha256", "start the process", "wait for /health"]
        return {"ok": True, "steps": steps}

    async def load(self, name: str, sha256: str) -> dict:
        await self._ready()
        r = self._recipe(name, sha256)
        self._checking = checked_off_loop(r.model)  # a model is GBs: off the loop
        if await asyncio.wrap_future(self._checking) != r.model_sha256:
            raise ActionFailed("identity_drift", f"recipe {name!r}: the model file changed since the recipe was read")
        await self._stop()
        await self._start(r)
        return {"incarnation": str(self.incarnation)}

    async def unload(self, name: str, sha256: str) -> dict:
        await self._ready()
        self._recipe(name, sha256)
        await self._stop()
        return {"unloaded": name}

    async def identity(self, headers: dict) -> dict:
        await self._ready()
        rec = self.loaded
        if rec is None:
            raise ActionFailed("unavailable", "no engine loaded")
        if rec.kind == "vllm":
            return await self._vllm_identity(rec, headers)
        r = await self._client.get(f"{self.url}/props", headers=headers)
        if r.status_code != 200:
            raise ActionFailed(f"http_{r.status_code}", f"engine /props: HTTP {r.status_code}")
        props = answer_object(r, "engine /props")
        settings = props.get("default_generation_settings")
        return {"recipe": rec.name, "recipe_sha256": rec.sha256, "incarnation": str(self.incarnation),
                "model": rec.model_sha256[:8], "model_sha256": rec.model_sha256,
                "host_cache_bytes": rec.host_cache_bytes(), "build_info": props.get("build_info"),
                "total_slots": props.get("total_slots"),
                "n_ctx": settings.get("n_ctx") if isinstance(settings, dict) else None}

    async def _vllm_identity(self, rec: LocalRecipe, headers: dict) -> dict:
        """vLLM's own account: its version, the model it serves (and the context it allows), and the KV
        cache it was given, from `vllm:cache_config_info` (vllm/v1/metrics/loggers.py, whose labels are
        the engine's CacheConfig)."""
        version = await self._get_json("/version", headers)
        models = (await self._get_json("/v1/models", headers)).get("data")
        served = models[0] if isinstance(models, list) and models and isinstance(models[0], dict) else {}
        cache = vllm_cache_config((await self._client.get(f"{self.url}/metrics", headers=headers)).text)
        return {"recipe": rec.name, "recipe_sha256": rec.sha256, "incarnation": str(self.incarnation),
                "model": served.get("id"), "model_sha256": rec.model_sha256, "max_model_len": served.get("max_model_len"),
                "host_cache_bytes": rec.host_cache_bytes(), "engine_version": version.get("version"),
                **{f"kv_{k}": cache.get(k) for k in ("block_size", "num_gpu_blocks", "num_cpu_blocks",
                                                     "kv_offloading_size", "enable_prefix_caching")}}

    async def _get_json(self, path: str, headers: dict) -> dict[str, Any]:
        r = await self._client.get(f"{self.url}{path}", headers=headers)
        if r.status_code != 200:
            raise ActionFailed(f"http_{r.status_code}", f"engine {path}: HTTP {r.status_code}")
        return answer_object(r, f"engine {path}")

    async def close(self) -> None:
        await self._stop()
        await self._client.aclose()


def vllm_cache_config(exposition: str) -> dict[str, str]:
    """The labels of vLLM's `vllm:cache_config_info` gauge (an empty dict when it is not there)."""
    from flare_diag.daemon.hosts.metrics import families
    for sample in families(exposition).get("vllm:cache_config_info", []):
        return dict(sample.labels)
    return {}


def process_group_rss(pgid: int) -> int | None:
    """The summed resident set of every process in the group, from /proc (None off Linux)."""
    page, total, seen = os.sysconf("SC_PAGE_SIZE"), 0, False
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            # the command name is in parentheses and may hold spaces: the fields after its last ')'
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:  # pgrp; rss (pages) is stat field 24
            total += int(fields[21]) * page
            seen = True
    return total if seen else None


def _port_taken(host: str, port: int) -> bool:
    """Whether something already listens on host:port (TIME_WAIT leftovers of a stopped engine do not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False
