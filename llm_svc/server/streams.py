"""The open Generate streams, on the event loop: where the engine thread's events land.

The worker posts each step's events with `loop.call_soon_threadsafe(streams.dispatch, …)`;
`dispatch` routes them to each stream's asyncio queue. Events for a stream already closed
(its client left) are dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from llm_svc.server.errors import RequestError
from llm_svc.server.events import Admitted, StreamEvent


class RequestStream:
    """One request's event queue on the loop; `admitted` / `finished` track its progress."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self.admitted = False
        self.finished = False

    async def next(self) -> StreamEvent:
        return await self.queue.get()


class StreamRegistry:
    """Request id → open stream. Loop-thread only."""

    def __init__(self) -> None:
        self._streams: dict[str, RequestStream] = {}
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Open streams not yet admitted (queued here or in the engine)."""
        return self._waiting

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._streams

    def __len__(self) -> int:
        return len(self._streams)

    def open(self, request_id: str) -> RequestStream:
        if request_id in self._streams:
            raise RequestError(f"request_id={request_id!r} is invalid: already in flight")
        stream = RequestStream(request_id)
        self._streams[request_id] = stream
        self._waiting += 1
        return stream

    def close(self, stream: RequestStream) -> None:
        if self._streams.get(stream.request_id) is stream:
            del self._streams[stream.request_id]
            if not stream.admitted:
                self._waiting -= 1

    def dispatch(self, events: Iterable[StreamEvent]) -> None:
        for event in events:
            stream = self._streams.get(event.request_id)
            if stream is None:
                continue
            if isinstance(event, Admitted) and not stream.admitted:
                stream.admitted = True
                self._waiting -= 1
            stream.queue.put_nowait(event)
