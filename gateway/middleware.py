"""ASGI middleware: a body-size and body-time limit (413 / 408 in OpenAI's shape, before
anything is parsed) and request metrics."""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import metrics
from gateway.errors import APIError

# Paths that label metrics as themselves; anything else is "other" (bounded cardinality).
KNOWN_ROUTES = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/healthz", "/readyz", "/metrics"}
)


class BodyLimit:
    """Read the whole request body up to `max_bytes` (413 beyond; a Content-Length over it
    is refused before a byte is read) within `timeout_s` in all (408 after: a client that
    trickles its body cannot hold a slot for long), then replay it."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        too_large = APIError(
            413,
            f"request body is over the limit of {self.max_bytes} bytes",
            code="request_too_large",
        )
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await too_large.response()(scope, receive, send)
                return
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._read(receive)
        except TimeoutError:
            slow = APIError(
                408,
                f"request body not received within {self.timeout_s:g} s",
                code="request_timeout",
            )
            await slow.response()(scope, receive, send)
            return
        if body is None:  # the client left
            return
        if len(body) > self.max_bytes:
            await too_large.response()(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes | None:
        """The body (cut short just past `max_bytes`), or None if the client left."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            chunks.append(chunk)
            if size > self.max_bytes or not message.get("more_body", False):
                return b"".join(chunks)


class RequestMetrics:
    """Count and time every HTTP request by route and status (FastAPI makes the server
    span itself, under the caller's trace context)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = (
            path
            if path in KNOWN_ROUTES
            else ("/v1/models/{id}" if path.startswith("/v1/models/") else "other")
        )
        status = 500
        started = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            metrics.REQUESTS.labels(route, str(status)).inc()
            metrics.REQUEST_SECONDS.labels(route).observe(time.perf_counter() - started)
