"""Server-sent events: one `data:` line per JSON chunk, ending with `data: [DONE]`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from gateway.errors import APIError

DONE = b"data: [DONE]\n\n"


def sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def event_stream(
    chunks: AsyncIterator[dict],
    on_close: Callable[[BaseException | None], None],
    headers: dict[str, str] | None = None,
) -> StreamingResponse:
    """Stream `chunks` as SSE; an error after acceptance becomes an error event (the status
    line is already sent), and the stream always ends with [DONE]."""

    async def body():
        error = None
        try:
            async for chunk in chunks:
                yield sse(chunk)
        except APIError as err:
            error = err
            yield sse(err.body())
        except BaseException as err:  # the client left (cancelled) or a bug: still close
            error = err
            raise
        finally:
            on_close(error)
        yield DONE

    return StreamingResponse(
        body(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
    )
