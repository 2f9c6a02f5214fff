"""Server-sent events: one `data:` line per JSON chunk, ending with `data: [DONE]`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from gateway.errors import APIError

DONE = b"data: [DONE]\n\n"


def sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class _ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that always closes its body and calls `on_done` once it ends:
    sent in full, the client gone before or during the body, or the server stopping.
    (Starlette drops the body iterator of a stream it cancels, and a generator that never
    started runs no `finally`.)"""

    def __init__(self, content, on_done: Callable[[], None], **kwargs) -> None:
        super().__init__(content, **kwargs)
        self._on_done = on_done

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            self._on_done()


async def _until(chunks: AsyncIterator[dict], ending: asyncio.Event) -> AsyncIterator[dict]:
    """`chunks` until `ending` is set; then the one being awaited is cancelled (which ends
    the generations) and a 503 `shutting_down` is raised, for the stream's error event."""
    waiter = asyncio.ensure_future(ending.wait())
    step: asyncio.Future | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(chunks))
            await asyncio.wait((step, waiter), return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                raise APIError(
                    503, "the gateway is shutting down; the stream was ended early",
                    code="shutting_down",
                )  # fmt: skip
            try:
                chunk = step.result()
            except StopAsyncIteration:
                return
            yield chunk
    finally:
        waiter.cancel()
        # Ending early, or the client left: stop the chunk being awaited before `chunks`
        # itself is closed (an async generator cannot be closed while it runs).
        if step is not None and not step.done():
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await step


def event_stream(
    chunks: AsyncIterator[dict],
    on_close: Callable[[BaseException | None], None],
    headers: dict[str, str] | None = None,
    ending: asyncio.Event | None = None,
) -> StreamingResponse:
    """Stream `chunks` as SSE; an error after acceptance becomes an error event (the status
    line is already sent), and the stream always ends with [DONE]. `on_close` runs exactly
    once, with the error if there was one (the client leaving is a CancelledError). When
    `ending` is set (the server is stopping) an open stream ends the same way, with a 503
    `shutting_down` error event."""
    closed = False

    def close(error: BaseException | None) -> None:
        nonlocal closed
        if not closed:
            closed = True
            on_close(error)

    async def body():
        error = None
        try:
            async with contextlib.aclosing(chunks):
                source = chunks if ending is None else _until(chunks, ending)
                async for chunk in source:
                    yield sse(chunk)
        except APIError as err:
            error = err
            yield sse(err.body())
        except BaseException as err:  # the client left (cancelled) or a bug: still close
            error = err
            raise
        finally:
            close(error)
        yield DONE

    def done() -> None:  # the body never ran, or stopped without its finally
        close(asyncio.CancelledError("the stream ended before its last chunk"))

    return _ClosingStreamingResponse(
        body(),
        done,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
    )
