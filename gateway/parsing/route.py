"""The API routes' class: a JSON body over the parser's size threshold is parsed and
validated in a worker process (gateway/parsing/pool.py) before FastAPI's handler runs; the
handler then finds it already parsed (`request.json()` returns the validated model, which
FastAPI's validation passes as it is), and a body kept in shared memory is freed by then.
Smaller bodies are parsed by FastAPI on the loop."""

from __future__ import annotations

import email.message
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from gateway import metrics
from gateway.middleware import SHARED_BODY
from gateway.parsing.shared_body import SharedBody

# What FastAPI reads as the body of a request already parsed (it only checks it is not empty).
_PARSED = b"{}"


class ParsedBodyRoute(APIRoute):
    """An APIRoute whose body model is parsed by `request.app.state.gateway.bodies`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler
        model = self.body_field.field_info.annotation

        async def parse_then_handle(request: Request) -> Response:
            shared = request.scope.get(SHARED_BODY)
            try:
                await _parse(request, model, shared)
            finally:
                if shared is not None:
                    # Freed before the request is routed: a stream may last minutes.
                    shared.release()
            return await handler(request)

        return parse_then_handle


async def _parse(request: Request, model: Any, shared: SharedBody | None) -> None:
    parser = request.app.state.gateway.bodies
    body = shared if shared is not None else await request.body()
    is_json = _is_json(request.headers.get("content-type"))
    if parser.takes(body) and is_json:
        # Starlette's Request.json() returns `_json` when set; FastAPI reads the body first
        # and only asks for its JSON when the body is not empty.
        request._json = await parser.parse(model, body)
        request._body = _PARSED
    elif shared is not None:  # not JSON: FastAPI's own answer, from the bytes
        request._body = shared.to_bytes()
    elif body:
        metrics.BODY_PARSES.labels("loop").inc()


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI would read a body of this type as JSON (as fastapi/routing.py
    decides: application/json or application/*+json)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )
