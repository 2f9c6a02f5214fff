"""ASGI middleware: a body-size limit (413 in OpenAI's shape, before anything is parsed)
and request metrics."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import metrics
from gateway.errors import APIError

# Paths that label metrics as themselves; anything else is "other" (bounded cardinality).
KNOWN_ROUTES = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/healthz", "/readyz", "/metrics"}
)


class BodyLimit:
    """Read the whole request body up to `max_bytes` (413 beyond), then replay it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

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
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await too_large.response()(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


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
