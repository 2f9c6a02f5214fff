"""Exception handlers: APIError, FastAPI's validation and HTTP errors, and anything
unexpected all leave as OpenAI's error body; plus that body's schema for /openapi.json."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.errors import APIError, bad_request

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The OpenAI error body (documented on every route for its 4xx/5xx statuses)."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict] = {
    status: {"model": ErrorResponse} for status in (400, 401, 404, 405, 408, 413, 429, 503)
}


def _location(loc: tuple) -> str | None:
    """A pydantic error location as a dotted param. Where a field takes one of several types,
    pydantic adds the type it tried (`str`, `list[str]`, `function-after[...]`): not a param."""
    parts = [
        str(part)
        for part in loc
        if part not in ("body", "query", "path")
        and not (isinstance(part, str) and (part in _TYPE_TAGS or "[" in part))
    ]
    return ".".join(parts) or None


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _described(error: dict) -> str:
    """One pydantic error as `param: what is wrong (got <value>)`; long values are cut."""
    text = f"{_location(tuple(error.get('loc', ()))) or 'body'}: {error.get('msg')}"
    value = error.get("input")
    if isinstance(value, (str, int, float, bool)) or value is None:
        shown = repr(value)
        text += f" (got {shown[:60] + '...' if len(shown) > 60 else shown})"
    return text


def install_error_handlers(app: FastAPI) -> None:
    """Route every error through the OpenAI body."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, err: RequestValidationError) -> JSONResponse:
        errors = err.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        param = _location(tuple(first.get("loc", ())))
        if first.get("type") == "json_invalid":
            return bad_request(f"request body is not valid JSON: {first['msg']}").response()
        message = "; ".join(_described(error) for error in errors[:5])
        # 400, as OpenAI and vLLM answer an invalid request (docs/api-fields.md).
        return bad_request(message, param, "invalid_value").response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, err: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if err.status_code == 404 else None
        return APIError(err.status_code, str(err.detail), code=code).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error: %s", err)
        return APIError(500, "internal error", code="internal_error").response()
