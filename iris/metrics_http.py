"""/metrics (Prometheus text) and /healthz over plain HTTP on a service's metrics port.

Served from a daemon thread, so a busy event loop or engine never delays a scrape or fails a
liveness probe. `/healthz` answers the `health()` dict as JSON: 200 while its "ok" is true,
503 otherwise. Anything else is 404. One implementation for every gRPC service.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


class MetricsHTTPServer:
    """GET /metrics and /healthz on (host, port); port 0 binds any free port (see `.port`)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        health: Callable[[], dict],
        host: str,
        port: int,
        name: str = "metrics-http",
    ) -> None:
        self._server = ThreadingHTTPServer((host, port), _handler(registry, health))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.1,), name=name, daemon=True
        )

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(registry: CollectorRegistry, health: Callable[[], dict]):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path == "/healthz":
                body = health()
                status = 200 if body.get("ok") else 503
                self._send(status, "application/json", json.dumps(body).encode())
            else:
                self._send(404, "text/plain", b"not found\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002
            log.debug("metrics http: " + format, *args)

    return Handler
