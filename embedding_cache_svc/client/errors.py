"""What the client library raises, and the mapping from gRPC status codes onto it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc


class CacheError(Exception):
    """Any failure of a cache call; `code` is the gRPC status code when there was one."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class CacheUnavailable(CacheError):
    """The service (or its Redis) cannot be reached; retry later or treat as a miss."""


class CacheTimeout(CacheUnavailable):
    """The call's explicit deadline passed."""


class CacheInvalidArgument(CacheError, ValueError):
    """The request was refused as malformed (the message names the value and the limit)."""


def from_rpc_error(err: grpc.RpcError, op: str) -> CacheError:
    """The typed error for a failed call (grpc and grpc.aio errors alike)."""
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    message = f"cache {op}: {details}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CacheTimeout(message, code)
    if code == grpc.StatusCode.UNAVAILABLE:
        return CacheUnavailable(message, code)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return CacheInvalidArgument(message, code)
    return CacheError(message, code)


@contextlib.contextmanager
def rpc_errors(op: str) -> Iterator[None]:
    """Raise a failed call inside as its typed error (see `from_rpc_error`)."""
    try:
        yield
    except grpc.RpcError as err:
        raise from_rpc_error(err, op) from None
