"""A minimal asyncio HTTP endpoint for Prometheus `/metrics` and `/healthz`.

Only GET on those two paths; anything else is 404. It shares the service's event loop and
needs no web framework.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)
READ_TIMEOUT_S = 5.0


class MetricsHttp:
    """Serves `registry` at /metrics and `health()` (a dict; "ok" key decides 200/503) at
    /healthz."""

    def __init__(self, registry: CollectorRegistry, health: Callable[[], dict]) -> None:
        self._registry = registry
        self._health = health
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Bind (port 0 = any free one) and return the bound port."""
        self._server = await asyncio.start_server(self._handle, host, port)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _respond(self, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/healthz":
            health = self._health()
            status = "200 OK" if health.get("ok") else "503 Service Unavailable"
            return status, "application/json", json.dumps(health).encode()
        return "404 Not Found", "text/plain", b"not found\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
            while (await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)) not in (
                b"\r\n",
                b"\n",
                b"",
            ):
                pass  # headers are not needed
            parts = request_line.decode("latin-1").split()
            if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            else:
                status, ctype, body = self._respond(parts[1].split("?", 1)[0])
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (body if parts and parts[0] != "HEAD" else b""))
            await writer.drain()
        except (TimeoutError, ConnectionError) as err:
            log.debug("metrics http request dropped: %s", err)
        finally:
            writer.close()
