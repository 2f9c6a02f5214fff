"""The API routes' class: a JSON body over the parser's size threshold is parsed and
validated in a worker process (gateway/parsing/pool.py) before FastAPI's handler runs; the
handler then finds it already parsed (`request.json()` returns the validated model, which
FastAPI's validation passes as it is). Smaller bodies are parsed by FastAPI on the loop."""

from __future__ import annotations

import email.message
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from gateway import metrics


class ParsedBodyRoute(APIRoute):
    """An APIRoute whose body model is parsed by `request.app.state.gateway.bodies`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler
        model = self.body_field.field_info.annotation

        async def parse_then_handle(request: Request) -> Response:
            parser = request.app.state.gateway.bodies
            body = await request.body()
            if parser.takes(body) and _is_json(request.headers.get("content-type")):
                # Starlette's Request.json() returns `_json` when set.
                request._json = await parser.parse(model, body)
            elif body:
                metrics.BODY_PARSES.labels("loop").inc()
            return await handler(request)

        return parse_then_handle


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
