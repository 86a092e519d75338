"""Time to first token as the project's client measures it, beside NVIDIA's AIPerf, in one run against one
streaming server that stamps its own times.

The server (asyncio, HTTP/1.1 keep-alive, an OpenAI-style SSE stream, in a process of its own) holds each request a fixed 20 ms
before its first token and notes, per request, the time from having read the request whole to having
flushed the first token's chunk. A client's TTFT error is its TTFT minus the server's own figure for the
same request (matched by X-Request-ID: the server answers with the client's, or with its own). The
project's client is `Target.send_request`, as a window sends (a connection of its own per generation);
AIPerf runs as its own command (`aiperf profile`, its default pooled connections) from a separate
environment (`--aiperf PATH`, or `aiperf` on PATH); without it only the project's side runs, said so.

Prints, per concurrency, the median and p99 error of each client and their ratios, and each client's rate.
`--tls`: the project's client also over https to the same server behind TLS (a self-signed certificate made
with openssl for the run), its errors beside its own over http and AIPerf's (over http).

Usage: python bench/client_accuracy.py [--requests 200] [--runs 3] [--concurrency 1 4] [--aiperf PATH] [--tokenizer DIR] [--tls]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FIRST_TOKEN_S = 0.020
TOKENS = 8
BODY = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "count to eight"}], "stream": True,
                   "stream_options": {"include_usage": True}, "max_tokens": TOKENS}).encode()


class StampingServer:
    """The server: per request id, its headers-read-to-first-flush time in ns."""

    def __init__(self) -> None:
        self.ttft_ns: dict[str, int] = {}
        self._n = 0
        self.port = 0

    async def start(self, tls: ssl.SSLContext | None = None) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while not writer.is_closing() and await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        line = await reader.readline()
        if not line:
            return False
        method, path, _ = line.decode().split(" ", 2)
        headers = {}
        while (h := await reader.readline()) not in (b"\r\n", b""):
            k, _, v = h.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        read_ns = time.perf_counter_ns()
        self._n += 1
        rid = headers.get("x-request-id") or f"s{self._n}"
        if method == "GET":  # the bench reading the server's stamps, or a client asking the models before it starts
            payload = json.dumps(self.ttft_ns if path == "/_ttft" else
                                 {"object": "list", "data": [{"id": "bench", "object": "model"}]}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload)
            await writer.drain()
            return True
        del body
        await asyncio.sleep(FIRST_TOKEN_S)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                     b"x-request-id: " + rid.encode() + b"\r\n\r\n" + _chunk(_event(rid, {"content": "t0"})))
        await writer.drain()
        self.ttft_ns[rid] = time.perf_counter_ns() - read_ns
        for i in range(1, TOKENS):
            await asyncio.sleep(0.002)
            if writer.is_closing():  # a client that went away (AIPerf drops its connections at its end)
                return False
            writer.write(_chunk(_event(rid, {"content": f" t{i}"}, finish="length" if i == TOKENS - 1 else None)))
        usage = {"id": rid, "object": "chat.completion.chunk", "model": "bench", "choices": [],
                 "usage": {"prompt_tokens": 5, "completion_tokens": TOKENS, "total_tokens": TOKENS + 5}}
        writer.write(_chunk(b"data: " + json.dumps(usage).encode() + b"\n\n") + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        return headers.get("connection", "").lower() != "close"


class Server:
    """The stamping server in a process of its own, so that neither client shares its loop or its GIL; with
    `certificate` (cert, key) it answers over TLS."""

    def __init__(self, certificate: tuple[Path, Path] | None = None) -> None:
        self.certificate = certificate
        self.scheme = "https" if certificate else "http"

    def __enter__(self) -> Server:
        tls = ["--serve-tls", *map(str, self.certificate)] if self.certificate else []
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", *tls], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())  # type: ignore[union-attr]
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait()

    def ttft_ns(self) -> dict[str, int]:
        import httpx
        verify = ssl.create_default_context(cafile=str(self.certificate[0])) if self.certificate else True
        return httpx.get(f"{self.scheme}://127.0.0.1:{self.port}/_ttft", timeout=30, verify=verify).json()


async def serve(certificate: list[str] | None) -> None:
    server = StampingServer()
    tls = None
    if certificate:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(*certificate)
    await server.start(tls)
    print(server.port, flush=True)
    await asyncio.Event().wait()


def _event(rid: str, delta: dict, finish: str | None = None) -> bytes:
    """One chunk of the answer `rid`: every chunk of an answer names it (and the client holds it to that)."""
    chunk = {"id": rid, "object": "chat.completion.chunk", "model": "bench",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


async def ours(server: Server, requests: int, concurrency: int) -> tuple[list[float], float]:
    """The project's client: (TTFT errors in ms, requests a second)."""
    from flare_diag.daemon.hosts.fixture import Fixture
    from flare_diag.daemon.hosts.site import sim_site
    from flare_diag.daemon.hosts.bounds import StallBound
    from flare_diag.daemon.hosts.target import Target
    site = sim_site(f"{server.scheme}://127.0.0.1:{server.port}", "bench-token")
    fx = Fixture(name="bench", bodies=[BODY], sha256=[hashlib.sha256(BODY).hexdigest()], sampling={})
    target = Target(site, {"bench": fx}, "bench")
    target.stall = StallBound(120.0, 120.0, 120.0)  # as a window's runner bounds every stream (the plan's default)
    seen: list[tuple[int, str]] = []
    left = list(range(requests))

    async def worker() -> None:
        while left:
            left.pop()
            out = await target.send_request({"phase": "bench", "fixture": "bench", "order_index": 0, "body_index": 0,
                                             "body_sha256": fx.sha256[0]})
            seen.append((out["first_token_ns"], out["request_id"]))

    t = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await target.close()
    rate = requests / (time.perf_counter() - t)
    stamps = server.ttft_ns()
    return [(ft - stamps[rid]) / 1e6 for ft, rid in seen], rate


def aiperf(exe: str, server: Server, requests: int, concurrency: int, tokenizer: str | None,
           ) -> tuple[list[float], float]:
    """AIPerf against the same server (run while this process's loop serves): (TTFT errors in ms, rate)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [exe, "profile", "--model", "bench", "--url", f"http://127.0.0.1:{server.port}", "--endpoint-type", "chat",
               "--streaming", "--concurrency", str(concurrency), "--request-count", str(requests),
               "--synthetic-input-tokens-mean", "5", "--output-tokens-mean", str(TOKENS), "--artifact-dir", tmp,
               "--ui-type", "none"] + (["--tokenizer", tokenizer] if tokenizer else [])
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"aiperf failed ({p.returncode}): {(p.stderr or p.stdout)[-1500:]}")
        records = [json.loads(line) for f in Path(tmp).rglob("*.jsonl") for line in f.read_text().splitlines() if line.strip()]
    stamps = server.ttft_ns()
    errors: list[float] = []
    for r in records:
        meta, metrics = r.get("metadata") or {}, r.get("metrics") or {}
        rid = meta.get("x_request_id")
        ttft = metrics.get("time_to_first_token") or {}
        if rid in stamps and ttft.get("value") is not None:
            scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[ttft.get("unit", "ms")]
            errors.append(float(ttft["value"]) * scale - stamps[rid] / 1e6)
    # its rate over its own requests, first send to last answer (not its start-up)
    metas = [r.get("metadata") or {} for r in records]
    span_s = (max(m["request_end_ns"] for m in metas) - min(m["request_start_ns"] for m in metas)) / 1e9
    return errors, len(metas) / span_s


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--aiperf", default=shutil.which("aiperf"), help="the aiperf command (its own environment)")
    ap.add_argument("--tokenizer", default=None,
                    help="a local Hugging Face tokenizer folder for aiperf (offline it cannot fetch one; the vLLM "
                         "tests' tiny model has one: fixtures/engines/vllm/make_model.py OUT)")
    ap.add_argument("--tls", action="store_true", help="also the project's client over https (a self-signed certificate)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the server's own process
    ap.add_argument("--serve-tls", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        await serve(args.serve_tls)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        certificate = _certificate(Path(tmp)) if args.tls else None
        await _compare(args, certificate)
    return 0


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, which this process's clients are told to trust (SSL_CERT_FILE,
    read by httpx's default context as the daemon's clients build it)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    os.environ["SSL_CERT_FILE"] = str(cert)
    return cert, key


async def _compare(args: argparse.Namespace, certificate: tuple[Path, Path] | None) -> None:
    loop = asyncio.get_running_loop()
    with Server() as server:
        for c in args.concurrency:
            mine, theirs, my_rate, their_rate = [], [], [], []
            for _ in range(args.runs):
                e, r = await ours(server, args.requests, c)
                mine += e
                my_rate.append(r)
                if args.aiperf:
                    e, r = await loop.run_in_executor(None, aiperf, args.aiperf, server, args.requests, c,
                                                     args.tokenizer)
                    theirs += e
                    their_rate.append(r)
            print(f"C{c}: flare-diag TTFT error median {statistics.median(mine):.3f} ms, p99 {pct(mine, 0.99):.3f} ms, "
                  f"{statistics.median(my_rate):.1f} requests/s ({len(mine)} requests)")
            if certificate is not None:
                with Server(certificate) as tls_server:
                    over_tls: list[float] = []
                    for _ in range(args.runs):
                        over_tls += (await ours(tls_server, args.requests, c))[0]
                print(f"C{c}: flare-diag over https TTFT error median {statistics.median(over_tls):.3f} ms, p99 "
                      f"{pct(over_tls, 0.99):.3f} ms; ratio https/http median {statistics.median(over_tls) / statistics.median(mine):.2f}x"
                      + (f", https/aiperf (http) median {statistics.median(over_tls) / statistics.median(theirs):.2f}x, p99 "
                         f"{pct(over_tls, 0.99) / pct(theirs, 0.99):.2f}x" if theirs else ""))
            if not theirs:
                print(f"C{c}: aiperf not run (no aiperf command: install it in its own environment, pass --aiperf)")
                continue
            print(f"C{c}: aiperf TTFT error median {statistics.median(theirs):.3f} ms, p99 {pct(theirs, 0.99):.3f} ms, "
                  f"{statistics.median(their_rate):.1f} requests/s ({len(theirs)} requests)")
            print(f"C{c}: ratio flare-diag/aiperf TTFT error median {statistics.median(mine) / statistics.median(theirs):.2f}x, "
                  f"p99 {pct(mine, 0.99) / pct(theirs, 0.99):.2f}x; rate {statistics.median(my_rate) / statistics.median(their_rate):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
