"""uvicorn's HTTP/1.1 protocol with a deadline on each request's head.

uvicorn bounds the body only through the app (gateway/middleware.py) and idle keep-alive
connections only after a response; a client that opens a connection and sends its request
line and headers a byte at a time (or nothing at all) is held open for ever, and a few
hundred such clients fill `limit_concurrency`. Here a connection whose request head has not
fully arrived within `timeout_s` — of the connection opening, or of the previous response
ending — is closed.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def head_deadline_protocol(timeout_s: float) -> type[H11Protocol]:
    """The protocol class to give uvicorn.Config(http=...)."""

    class HeadDeadlineProtocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._start_head_timer()

        def handle_events(self) -> None:
            super().handle_events()
            # h11 leaves IDLE once a whole request head is parsed.
            if self.conn.their_state is not h11.IDLE:
                self._stop_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._start_head_timer()

        def connection_lost(self, exc) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def _start_head_timer(self) -> None:
            self._stop_head_timer()
            self._head_timer = self.loop.call_later(timeout_s, self._head_too_slow)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeadDeadlineProtocol
