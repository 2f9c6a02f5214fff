"""Request errors before acceptance, and the gRPC status each one maps to (docs/design/engine.md).

The server's own errors carry their code; the engine's errors (llm_svc.engine.errors) are
mapped by class, the first match along the error's MRO. Anything unknown is INTERNAL.
"""

from __future__ import annotations

import grpc

from llm_svc.engine.errors import (
    CacheUnavailableError,
    EmbeddingMissingError,
    ImageFailedError,
    InvalidRequestError,
    RequestDataError,
)

EMBEDDING_MISSING = "embedding missing"  # the gateway matches this text to retry once
# The gateway matches this text: the cache every pod shares is down, so another pod would
# fail the same way (the request gets a 503 at once, not one try per pod).
CACHE_UNAVAILABLE = "embedding cache unavailable"


class RequestError(Exception):
    """A request the server refuses itself, with the status it gets."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class QueueFullError(RequestError):
    """Too many requests wait for admission; the caller should retry after `retry_after_ms`."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, waiting: int, limit: int, retry_after_ms: int) -> None:
        self.retry_after_ms = retry_after_ms
        super().__init__(
            f"{waiting} requests are waiting for admission, the limit is {limit}; "
            f"retry after {retry_after_ms} ms"
        )


class AbortedBeforeAcceptance(RequestError):
    """An Abort reached the request while it still waited for admission."""

    code = grpc.StatusCode.CANCELLED


class StoppedBeforeAcceptance(RequestError):
    """The pod stopped while the request still waited for admission. The pod, not the
    request, is the reason: UNAVAILABLE, so a gateway tries another pod."""

    code = grpc.StatusCode.UNAVAILABLE


class EngineFailure(RequestError):
    """The engine raised while running the request's step; the request is dropped. The pod
    failed, not the request: UNAVAILABLE, so a gateway that has sent nothing of it to its
    client tries another pod."""

    code = grpc.StatusCode.UNAVAILABLE


_ENGINE_CODES: dict[type[BaseException], grpc.StatusCode] = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    ImageFailedError: grpc.StatusCode.INVALID_ARGUMENT,
    EmbeddingMissingError: grpc.StatusCode.FAILED_PRECONDITION,
    CacheUnavailableError: grpc.StatusCode.FAILED_PRECONDITION,
    RequestDataError: grpc.StatusCode.DATA_LOSS,
}


def status_of(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and details for an error that ends a request (before acceptance,
    or after it: the stream then ends with this status instead of `finished`).

    FAILED_PRECONDITION details carry "embedding missing" or, for the cache being
    unreachable, "embedding cache unavailable": the gateway keys on both.
    """
    if isinstance(error, RequestError):
        return error.code, str(error)
    for cls in type(error).__mro__:
        code = _ENGINE_CODES.get(cls)
        if code is None:
            continue
        details = str(error)
        if cls is CacheUnavailableError:
            if CACHE_UNAVAILABLE not in details:
                details = f"{CACHE_UNAVAILABLE}: {details}"
        elif code is grpc.StatusCode.FAILED_PRECONDITION and EMBEDDING_MISSING not in details:
            details = f"{EMBEDDING_MISSING}: {details}"
        return code, details
    return grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}"


def retry_after_ms(error: BaseException) -> int | None:
    """The retry hint (trailing metadata `retry-after-ms`) an error carries, if any."""
    value = getattr(error, "retry_after_ms", None)
    return int(value) if value is not None else None
