"""Errors a request can get at the engine's boundary (the server maps them to gRPC
INVALID_ARGUMENT); they concern one request and never stop the engine."""

from __future__ import annotations

from typing import Any


class InvalidRequestError(ValueError):
    """A request the engine refuses; names the offending field, its value and the limit."""

    def __init__(self, field: str, value: Any, limit: str) -> None:
        self.field, self.value, self.limit = field, value, limit
        super().__init__(f"{field}={value!r} is invalid: {limit}")


class RequestTooLargeError(InvalidRequestError):
    """The request could never fit in the KV cache, even alone."""
