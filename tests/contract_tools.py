"""The second contract host (tests/contract_host.py) as a real process, with a site profile for it."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

from tests.daemontools import stop_process

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "fixtures" / "plans" / "2026-10-22-cache-diagnosis.toml"

BUILD = {"image": "47ce7fde", "flare_commit": "47581cca", "package": "d5aec154", "model": "dec48abd",
         "tensor_parallel": 2, "draft_tokens": 2, "host_cache_bytes": 32 << 30}
GPUS = [{"uuid": f"GPU-c0ffee{i}", "power_limit_w": 300, "memory_used_bytes": 50 << 30, "memory_total_bytes": 141 << 30}
        for i in range(2)]


CHANGING = ("/manager/v1/load", "/manager/v1/unload", "/quiesce", "/readmit", "/v1/chat/completions")


def host_changes(seen: list[dict], *, chats: bool = True) -> list[dict]:
    """The requests that changed the host: loads, unloads, quiesces, readmits, generations (unless
    `chats` is false) and a trace switch set to anything but its present state (site check sets it to
    what it already is, which changes nothing)."""
    paths = CHANGING if chats else CHANGING[:-1]
    return [x for x in seen if any(m in x.get("path", "") for m in paths)
            or ("trace_set" in x and x["trace_set"] != x["was"])]


class ContractHost:
    """Starts the host; `site` is a profile naming each of its five services with its own token."""

    def __init__(self, tmp: Path, cache_entries: int = 40, **extra) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.tokens = {s: secrets.token_hex(12) for s in ("serving", "manager", "router", "monitoring", "gpu")}
        self.request_log = tmp / "requests.jsonl"
        cfg = {"tokens": self.tokens, "cache_entries": cache_entries, "build": BUILD, "gpus": GPUS,
               "recipes": {"prod-incumbent": "model = dec48abd\nrole = incumbent\n",
                           "glm-candidate": "model = dec48abd\nrole = candidate\nhost_cache = rows\n"},
               "incumbent": "prod-incumbent", "request_log": str(self.request_log), **extra}
        (tmp / "host.json").write_text(json.dumps(cfg))
        self.metrics_profile = "sglang" if extra.get("sglang") else ""
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.contract_host", str(tmp / "host.json")], cwd=ROOT,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            self.stop()
            raise RuntimeError("the contract host did not start")
        self.urls = json.loads(line)
        self.site = self.write_site(tmp / "site")

    def write_site(self, folder: Path, tokens: dict[str, str] | None = None) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        for svc, tok in (tokens or self.tokens).items():
            (folder / f"{svc}.token").write_text(tok + "\n")
            (folder / f"{svc}.token").chmod(0o600)
        u = self.urls
        site = folder / "site.toml"
        site.write_text(
            (f'metrics_profile = "{self.metrics_profile}"\n' if self.metrics_profile else "") +
            f'[serving]\nurl = "{u["serving"]}"\ntoken_file = "serving.token"\n'
            f'[manager]\nurl = "{u["manager"]}"\ntoken_file = "manager.token"\ncandidate_recipe = "glm-candidate"\n'
            f'[router]\nurl = "{u["router"]}"\ntoken_file = "router.token"\nbackend = "primary"\n'
            f'[monitoring]\nurl = "{u["monitoring"]}"\ntoken_file = "monitoring.token"\ntarget = "primary"\n'
            f'[gpu]\nsource = "sim"\nurl = "{u["gpu"]}"\ntoken_file = "gpu.token"\n')
        return site

    def requests(self) -> list[dict]:
        if not self.request_log.exists():
            return []
        return [json.loads(line) for line in self.request_log.read_text().splitlines() if line]

    def get(self, service: str, path: str) -> str:
        """One authorised GET, as a person checking the host by hand would."""
        import urllib.request
        req = urllib.request.Request(self.urls[service] + path, headers={"Authorization": f"Bearer {self.tokens[service]}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.read().decode()

    def stop(self) -> None:
        stop_process(self.proc)
