"""Errors one request can get from the engine; they concern that request only and never
stop the engine. The server (llm_svc/server/errors.py) maps them to gRPC codes by class:
InvalidRequestError and ImageFailedError → INVALID_ARGUMENT, EmbeddingMissingError →
FAILED_PRECONDITION, CacheUnavailableError → FAILED_PRECONDITION ("embedding cache
unavailable": no other pod would do better), RequestDataError → DATA_LOSS."""

from __future__ import annotations

from typing import Any


class InvalidRequestError(ValueError):
    """A request the engine refuses; names the offending field, its value and the limit."""

    def __init__(self, field: str, value: Any, limit: str) -> None:
        self.field, self.value, self.limit = field, value, limit
        super().__init__(f"{field}={value!r} is invalid: {limit}")


class RequestTooLargeError(InvalidRequestError):
    """The request could never fit in the KV cache, even alone."""


class ImageFailedError(Exception):
    """The cache holds a failed(reason) entry for one of the request's images (it could not
    be decoded or encoded); the message is that reason. The server answers INVALID_ARGUMENT."""

    def __init__(self, reason: str, item_index: int | None = None) -> None:
        self.reason, self.item_index = reason, item_index
        super().__init__(reason)


class EmbeddingMissingError(Exception):
    """An image the request needs is in neither the prefix cache, the embedding cache, nor
    being encoded (or still pending at the deadline). The server answers FAILED_PRECONDITION
    and the gateway reserves, encodes and retries once; the message says "embedding missing"."""

    def __init__(self, detail: str, item_index: int | None = None) -> None:
        self.item_index = item_index
        super().__init__(f"embedding missing: {detail}")


class CacheUnavailableError(Exception):
    """The embedding cache could not be reached within its timeout (server: FAILED_PRECONDITION)."""


class RequestDataError(Exception):
    """One request's own data failed a check found late, inside a step or a fetch (an
    embedding with too few rows, the wrong width or non-finite values). That request ends
    with this error and the rest of its batch goes on; the server answers INTERNAL (the
    platform produced bad data, not the client)."""

    def __init__(self, detail: str, item_index: int | None = None) -> None:
        self.item_index = item_index
        super().__init__(detail)
