"""A throwaway Prometheus server for the steady-state tests: Debian's `prometheus` (installed by
.ci/run), a config written here scraping the targets it is given every second, its data in a
temporary folder, on a loopback port; started and stopped by the tests."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.daemontools import stop_process

BINARY = shutil.which("prometheus") or "/usr/bin/prometheus"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PromServer:
    """`targets`: [{"job", "url" (scheme://host:port), "path", "token_file"}]."""

    def __init__(self, targets: list[dict], interval_s: float = 1.0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="flare-diag-prom-"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        jobs = []
        for t in targets:
            u = urllib.parse.urlsplit(t["url"])
            job = [f"  - job_name: {json.dumps(t['job'])}",
                   f"    metrics_path: {json.dumps(t.get('path', '/metrics'))}",
                   f"    scheme: {u.scheme}"]
            if t.get("token_file"):
                job += ["    authorization:", "      type: Bearer", f"      credentials_file: {json.dumps(str(t['token_file']))}"]
            job += ["    static_configs:", f"      - targets: [{json.dumps(u.netloc)}]"]
            jobs.append("\n".join(job))
        (self.dir / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {interval_s:g}s\n  scrape_timeout: {interval_s:g}s\n"
            f"  evaluation_interval: {interval_s:g}s\nscrape_configs:\n" + "\n".join(jobs) + "\n")
        self.log = (self.dir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [BINARY, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
             f"--web.console.templates={self.dir}", f"--web.console.libraries={self.dir}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self.wait(lambda: self._get("/-/ready", raw=True) is not None, 60, "Prometheus ready")
        except BaseException:
            self.stop()
            raise

    def _get(self, path: str, raw: bool = False):
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                body = r.read()
        except OSError:
            return None
        return body if raw else json.loads(body)

    def query(self, q: str) -> list[dict]:
        d = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": q}))
        return (d or {}).get("data", {}).get("result", []) if d else []

    def value(self, q: str) -> float | None:
        r = self.query(q)
        return float(r[0]["value"][1]) if r else None

    def wait(self, pred, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{what}: not within {timeout:g} s; Prometheus said:\n"
                           + (self.dir / "prometheus.log").read_text()[-2000:])

    def wait_up(self, jobs: list[str], timeout: float = 60) -> None:
        """Until every job's target has been scraped (up == 1)."""
        self.wait(lambda: all(self.value(f'up{{job="{j}"}}') == 1 for j in jobs), timeout, f"targets {jobs} up")

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
