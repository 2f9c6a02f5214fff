"""uvicorn's HTTP/1.1 protocol with the door's limits on what arrives before the app runs.

- A deadline on each request's head: uvicorn bounds the body only through the app
  (gateway/middleware.py) and idle keep-alive connections only after a response; a client
  that sends its request line and headers a byte at a time (or nothing) would be held open
  for ever. A connection whose head has not fully arrived within `head_timeout_s` — of the
  connection opening, or of the previous response ending — is closed.
- The head's size, counted here as its bytes arrive: past `HeadLimits.line_bytes` of
  request line a 414, past `HeadLimits.header_bytes` of headers a 431. (h11's own limit
  fires only while a head is incomplete, and uvicorn then answers in plain text.)
- Open connections: past `max_connections`, the connection's first request is answered
  503 with Retry-After and the connection closed. (uvicorn's `limit_concurrency` answers
  in plain text, before any middleware; requests are bounded in gateway/middleware.py.)
- Every such answer, and uvicorn's own 400 for a request h11 cannot parse, is JSON in
  OpenAI's error shape.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.errors import APIError


@dataclass(frozen=True)
class HeadLimits:
    """The most bytes a request line and a header block (without the request line) hold."""

    line_bytes: int = 8 * 1024
    header_bytes: int = 16 * 1024

    @property
    def h11_buffer_bytes(self) -> int:
        """What to give h11 (`h11_max_incomplete_event_size`) so that these limits, checked
        first, are the ones that answer."""
        return self.line_bytes + self.header_bytes + 1024


def error_bytes(err: APIError, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 response carrying `err` in OpenAI's shape, closing the connection."""
    body = json.dumps(err.body()).encode()
    lines = [
        f"HTTP/1.1 {err.status} {HTTPStatus(err.status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    if err.retry_after:
        lines.append(f"retry-after: {err.retry_after}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def door_protocol(
    head_timeout_s: float,
    max_connections: int,
    retry_after_s: int = 1,
    limits: HeadLimits = HeadLimits(),  # noqa: B008 (frozen)
) -> type[H11Protocol]:
    """The protocol class to give uvicorn.Config(http=...), with
    `h11_max_incomplete_event_size=limits.h11_buffer_bytes`."""

    class DoorProtocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _over_capacity = False

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head = bytearray()
            # `connections` is the server's set of open connections, this one included.
            self._over_capacity = len(self.connections) > max_connections
            self._start_head_timer()

        def data_received(self, data: bytes) -> None:
            if self._over_capacity:
                busy = APIError(
                    503,
                    f"{len(self.connections) - 1} connections open, the gateway's limit is "
                    f"{max_connections}",
                    code="overloaded",
                    retry_after=retry_after_s,
                )
                self._refuse(busy)
                return
            if self.conn.their_state is h11.IDLE:
                refusal = self._head_refusal(data)
                if refusal is not None:
                    self._refuse(refusal)
                    return
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            # h11 leaves IDLE once a whole request head is parsed.
            if self.conn.their_state is not h11.IDLE:
                self._stop_head_timer()
                self._head = bytearray()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._head = bytearray()
                self._start_head_timer()

        def connection_lost(self, exc) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            # uvicorn's answer to a request h11 cannot parse, as JSON rather than text.
            self._refuse(APIError(400, f"malformed HTTP request: {msg}", code="bad_http"))

        def _head_refusal(self, data: bytes) -> APIError | None:
            """A 414 / 431 once the head so far is past a limit, else None."""
            room = limits.line_bytes + limits.header_bytes + 8 - len(self._head)
            self._head += data[: max(room, 0)]
            head = bytes(self._head)
            line_end = head.find(b"\r\n")
            line = line_end if line_end >= 0 else len(head)
            if line > limits.line_bytes:
                return APIError(
                    414,
                    f"request line is over the limit of {limits.line_bytes} bytes",
                    code="uri_too_long",
                )
            if line_end < 0:
                return None
            head_end = head.find(b"\r\n\r\n")
            headers = (head_end if head_end >= 0 else len(head)) - (line_end + 2)
            if headers > limits.header_bytes:
                return APIError(
                    431,
                    f"request headers are over the limit of {limits.header_bytes} bytes",
                    code="headers_too_large",
                )
            return None

        def _refuse(self, err: APIError) -> None:
            self._stop_head_timer()
            if not self.transport.is_closing():
                self.transport.write(error_bytes(err))
                self.transport.close()

        def _start_head_timer(self) -> None:
            self._stop_head_timer()
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_too_slow)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return DoorProtocol
