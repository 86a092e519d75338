"""A stand-in engine process for the local-engine lifecycle: answers /health and /props on --host/--port."""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, HTTPServer


class Handler(BaseHTTPRequestHandler):
    answered = 0  # on this connection

    def handle_one_request(self) -> None:
        if DROP_KEPT_CONNECTIONS and self.answered:
            # as an HTTP server closing an idle kept connection just as the next request arrives
            self.rfile.readline()
            self.close_connection = True
            return
        super().handle_one_request()
        self.answered += 1

    def do_GET(self) -> None:  # noqa: N802
        if NEVER_HEALTHY and self.path == "/health":  # as llama-server answers while its model loads
            body, status = {"error": {"code": 503, "message": "Loading model"}}, 503
        else:
            body = {"/health": {"status": "ok"}, "/props": {"build_info": "fake", "total_slots": 1}}.get(self.path)
            status = 200 if body else 404
        data = json.dumps(body or {"error": "not found"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


DROP_KEPT_CONNECTIONS = False
NEVER_HEALTHY = False

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--drop-kept-connections", action="store_true",
                    help="keep connections open (HTTP/1.1), then close each unanswered at its second request")
    ap.add_argument("--never-healthy", action="store_true", help="answer /health 503 (loading) for ever")
    a = ap.parse_args()
    NEVER_HEALTHY = a.never_healthy
    if a.drop_kept_connections:
        DROP_KEPT_CONNECTIONS = True
        Handler.protocol_version = "HTTP/1.1"
    HTTPServer((a.host, a.port), Handler).serve_forever()
