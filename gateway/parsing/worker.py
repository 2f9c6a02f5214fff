"""What a parse worker process runs: a body (in shared memory, or bytes) → the outcome
FastAPI's own parse and validation would reach, packed for the trip back
(gateway/parsing/transport.py) and, when large, left in a shared-memory segment of its own
for the gateway to read in bounded pieces and remove.

Outcomes: ("model", the validated request), ("errors", the first validation errors, as
FastAPI reports them), ("http", status, detail) for a body no JSON parser can read. Imports
nothing heavy: the pool spawns these processes with the gateway.
"""

from __future__ import annotations

import json
import os
from multiprocessing.shared_memory import SharedMemory

from pydantic import BaseModel, ValidationError

from gateway.parsing.transport import pack

MAX_ERRORS = 5  # what the error handler shows (gateway/api/errors.py)
MAX_INPUT_CHARS = 1000  # of an error's input: it is shown cut to 60 characters
INLINE_RESULT_BYTES = 64 * 1024  # a packed outcome up to this size travels in the pipe


def ready() -> bool:
    """A no-op, to have the pool start its processes."""
    return True


def parse_shared(model: type[BaseModel], name: str, size: int) -> bytes | tuple[str, int]:
    """The body in shared-memory segment `name` (its first `size` bytes) parsed as
    `parse_body` does: the packed outcome, or (segment name, size) where it was left."""
    segment = SharedMemory(name=name)
    try:
        body = bytes(segment.buf[:size])
    finally:
        segment.close()
    return _handed_back(parse_body(model, body))


def _handed_back(packed: bytes) -> bytes | tuple[str, int]:
    if len(packed) <= INLINE_RESULT_BYTES:
        return packed
    # The gateway's process removes the segment once read (or when the request is gone).
    try:
        segment = SharedMemory(create=True, size=len(packed))
    except OSError:
        return packed  # no room in /dev/shm: through the pipe, whole
    try:
        # Pages reserved before the write: a full /dev/shm is an OSError, never a SIGBUS.
        os.posix_fallocate(segment._fd, 0, segment.size)
        segment.buf[: len(packed)] = packed
    except OSError:
        segment.close()
        segment.unlink()
        return packed
    segment.close()
    return segment.name, len(packed)


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
