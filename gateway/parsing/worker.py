"""What a parse worker process runs: a body's bytes → the outcome FastAPI's own parse and
validation would reach, packed for the trip back (gateway/parsing/transport.py).

Outcomes: ("model", the validated request), ("errors", the first validation errors, as
FastAPI reports them), ("http", status, detail) for a body no JSON parser can read. Imports
nothing heavy: the pool spawns these processes with the gateway.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ValidationError

from gateway.parsing.transport import pack

MAX_ERRORS = 5  # what the error handler shows (gateway/api/errors.py)
MAX_INPUT_CHARS = 1000  # of an error's input: it is shown cut to 60 characters


def ready() -> bool:
    """A no-op, to have the pool start its processes."""
    return True


def parse_body(model: type[BaseModel], body: bytes) -> bytes:
    """`body` parsed as JSON and validated as `model`, packed; the same outcome as FastAPI's
    (fastapi/routing.py reads a JSON body with `json.loads`, then validates it)."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as err:
        error = {"type": "json_invalid", "loc": ("body", err.pos), "msg": "JSON decode error"}
        return pack(("errors", [{**error, "input": {}}]))
    except Exception:  # too deep (RecursionError), not UTF-8, ...: FastAPI's 400
        return pack(("http", 400, "There was an error parsing the body"))
    try:
        value = model.model_validate(data, from_attributes=True)
    except ValidationError as err:
        errors = err.errors(include_url=False, include_context=False)[:MAX_ERRORS]
        return pack(("errors", [_portable(error) for error in errors]))
    return pack(("model", value))


def _portable(error: dict) -> dict:
    """A validation error as the error handler reads it, without a body-sized input: only
    a scalar input is shown, and only its first characters."""
    value = error.get("input")
    if isinstance(value, str) and len(value) > MAX_INPUT_CHARS:
        value = _cut(value)
    elif not (isinstance(value, (str, int, float, bool)) or value is None):
        value = {}  # not shown
    loc = ("body", *error["loc"])
    return {"type": error["type"], "loc": loc, "msg": error["msg"], "input": value}


def _cut(text: str) -> str:
    """The start of `text`, with the quotes that decide how repr() quotes the whole."""
    cut = text[:MAX_INPUT_CHARS]
    for quote in ("'", '"'):
        if quote in text and quote not in cut:
            cut += quote
    return cut
