"""ASGI middleware: per-route body limits (413 / 408 / 405 in OpenAI's shape, before anything
is parsed), the bound on requests in flight (503), and request metrics."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import metrics
from gateway.errors import APIError
from gateway.parsing.shared_body import BodyBuffer, SharedBody

# Paths that label metrics as themselves; anything else is "other" (bounded cardinality).
KNOWN_ROUTES = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/healthz", "/readyz"}
)
# The scope key under which a large body is handed on in shared memory (BodyLimit).
SHARED_BODY = "iris.shared_body"


@dataclass(frozen=True)
class BodyCaps:
    """What one route's body may hold, counted before any parse: bytes; JSON values (commas
    plus one: an array or object of k values holds k - 1 commas); JSON objects (`{`: each
    becomes a validated model, the costliest part of a parse). Brackets and commas inside
    strings count too: the counts are upper bounds, which is what a cap needs."""

    max_bytes: int
    max_values: int
    max_objects: int


class BodyLimit:
    """Read the whole request body up to its route's `caps` (413 beyond; a Content-Length
    over it is refused before a byte is read) within `timeout_s` in all (408 after: a
    client that trickles its body cannot hold a slot for long), counting its JSON values
    and objects as it arrives (413 over the route's bounds, before any parse), then replay
    it. These caps bound what a parse may cost; bodies past a size are parsed in a worker
    process, not on the loop (gateway/parsing/, docs/design/door.md).

    A path that takes no body (probes, /v1/models, docs, unknown paths) answers any method
    but GET / HEAD with a 405, and a GET carrying a body with a 413, without reading it."""

    def __init__(
        self,
        app: ASGIApp,
        caps: dict[str, BodyCaps],
        timeout_s: float,
        spill_over_bytes: int | None = None,
    ) -> None:
        """`spill_over_bytes`: a body past this many bytes is kept in shared memory as it
        arrives, never joined, and handed on as `scope[SHARED_BODY]` (an empty body is
        replayed): the parse pool reads it there, and the route frees it once parsed
        (gateway/parsing/). None: always joined."""
        self.app = app
        self.caps = caps
        self.timeout_s = timeout_s
        self.spill_over_bytes = spill_over_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        caps = self.caps.get(scope["path"])
        if caps is None:
            await self._no_body(scope, receive, send)
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)  # the router answers 405
            return
        too_large = APIError(
            413,
            f"request body is over the limit of {caps.max_bytes} bytes for {scope['path']}",
            code="request_too_large",
        )
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > caps.max_bytes:
            await too_large.response()(scope, receive, send)
            return
        expected = int(length) if length is not None and length.isdigit() else None
        buffer = BodyBuffer(self.spill_over_bytes, caps.max_bytes, expected)
        try:
            await self._answer(scope, receive, send, caps, buffer, too_large)
        finally:
            buffer.release()

    async def _answer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        caps: BodyCaps,
        buffer: BodyBuffer,
        too_large: APIError,
    ) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._read(
                    receive, caps.max_bytes, BodyCount(caps, scope["path"]), buffer
                )
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
        if isinstance(body, APIError):
            await body.response()(scope, receive, send)
            return
        if body > caps.max_bytes:
            await too_large.response()(scope, receive, send)
            return
        kept = buffer.body()
        if isinstance(kept, SharedBody):
            scope[SHARED_BODY] = kept
            kept = b""
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": kept, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _no_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] not in ("GET", "HEAD"):
            refused = APIError(
                405,
                f"{scope['method']} is not allowed on {scope['path'][:100]!r}: use GET",
                code="method_not_allowed",
            )
            await refused.response(headers={"Allow": "GET, HEAD"})(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        chunked = _header(scope, b"transfer-encoding") is not None
        if chunked or (length is not None and length != b"0"):
            refused = APIError(
                413, f"{scope['path'][:100]!r} takes no request body", code="request_too_large"
            )
            await refused.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _read(
        self, receive: Receive, max_bytes: int, count: BodyCount, buffer: BodyBuffer
    ) -> int | APIError | None:
        """The body's size (its bytes kept in `buffer`, cut short just past `max_bytes`),
        its refusal by count, or None if the client left. Each chunk is counted as it
        arrives (a count of the whole at the end would hold the loop for ~10 ms on 16 MB);
        a body found over a count is read to its end without being kept, so that the
        client, still sending, reads the 413."""
        size = 0
        refusal: APIError | None = None
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if refusal is None:
                refusal = count.add(chunk)
                if refusal is None and size <= max_bytes:
                    await buffer.add(chunk)
                else:
                    buffer.drop()
            if size > max_bytes or not message.get("more_body", False):
                return refusal or size


class BodyCount:
    """A body's JSON values (commas + 1) and objects (`{`), counted chunk by chunk against
    its route's caps: `add` answers the 413 once a count is over its cap."""

    def __init__(self, caps: BodyCaps, path: str) -> None:
        self.caps = caps
        self.path = path
        self.values = 1
        self.objects = 0

    def add(self, chunk: bytes) -> APIError | None:
        self.values += chunk.count(b",")
        self.objects += chunk.count(b"{")
        for count, limit, what in (
            (self.values, self.caps.max_values, "JSON values (counted by commas)"),
            (self.objects, self.caps.max_objects, "JSON objects (counted by '{')"),
        ):
            if count > limit:
                return APIError(
                    413,
                    f"request body holds {count} or more {what}, over the limit of {limit} "
                    f"for {self.path}",
                    code="request_too_large",
                )
        return None


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


class RequestLimit:
    """At most `limit` HTTP requests in the app at once; past it, a JSON 503 with
    Retry-After at once (uvicorn's own `limit_concurrency` would answer in plain text,
    before any middleware). Connections are bounded apart, in gateway/http_protocol.py."""

    def __init__(self, app: ASGIApp, limit: int, retry_after_s: int) -> None:
        self.app = app
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            busy = APIError(
                503,
                f"{self.in_flight} requests in progress, the gateway's limit is {self.limit}",
                code="overloaded",
                retry_after=self.retry_after_s,
            )
            await busy.response()(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


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
