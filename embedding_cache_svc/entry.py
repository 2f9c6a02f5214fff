"""What the cache stores per item: a header describing raw tensor bytes, or a failure.

Keys: the cache key is ``fingerprint (32 bytes) ‖ item key`` where the item key is a
32-byte identity or a caller's 64-bit hash as 8 bytes (`MultimodalItem.key`). Checks on
what callers send live here so both stores and the servicer share them; each raises
`InvalidRequest` naming the value and the limit (the servicer maps it to INVALID_ARGUMENT).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from embedding_cache_svc.dtypes import item_size
from embedding_cache_svc.proto import cache_pb2
from iris.proto import common_pb2

FINGERPRINT_BYTES = 32
KEY_SIZES = (8, 32)
MAX_REASON_CHARS = 1024


class Status(enum.IntEnum):
    """An item's state as Reserve / Wait report it (values are cache.proto's); the stores
    answer with it and the clients return it."""

    PRESENT = cache_pb2.PRESENT
    PENDING = cache_pb2.PENDING
    RESERVED = cache_pb2.RESERVED
    FAILED = cache_pb2.FAILED
    FREE = cache_pb2.FREE


class InvalidRequest(ValueError):
    """A caller sent something the cache refuses; the message names the value and limit."""


@dataclass(frozen=True)
class Header:
    """A stored embedding: `token_count` x `hidden` elements of `dtype`, C order."""

    token_count: int
    hidden: int
    dtype: str
    checksum: int
    fingerprint: bytes

    @property
    def nbytes(self) -> int:
        return self.token_count * self.hidden * item_size(self.dtype)

    def to_proto(self) -> cache_pb2.EntryHeader:
        tensor = common_pb2.TensorHeader(
            dtype=self.dtype, shape=[self.token_count, self.hidden], checksum=self.checksum
        )
        return cache_pb2.EntryHeader(
            token_count=self.token_count,
            hidden=self.hidden,
            tensor=tensor,
            fingerprint=self.fingerprint,
        )

    def mismatch(self, token_count: int, hidden: int) -> str | None:
        """Why this entry may not answer a request expecting these values (None: it may).

        A zero expectation is not checked. The dtype is no mismatch (docs/design/multimodal.md): the
        entry is sent as stored and the consumer converts on read."""
        if token_count and self.token_count != token_count:
            return "token_count"
        if hidden and self.hidden != hidden:
            return "hidden"
        return None


@dataclass(frozen=True)
class Failed:
    """A failed(reason) entry: the item cannot be produced (e.g. the image does not decode)."""

    reason: str


def check_fingerprint(fingerprint: bytes) -> bytes:
    if len(fingerprint) != FINGERPRINT_BYTES:
        raise InvalidRequest(
            f"fingerprint is {len(fingerprint)} bytes, expected {FINGERPRINT_BYTES}"
        )
    return bytes(fingerprint)


def check_key(key: bytes) -> bytes:
    if len(key) not in KEY_SIZES:
        raise InvalidRequest(f"item key is {len(key)} bytes, expected 8 (hash) or 32 (identity)")
    return bytes(key)


def cache_key(fingerprint: bytes, key: bytes) -> bytes:
    """The store key of an item: fingerprint ‖ item key, both checked."""
    return check_fingerprint(fingerprint) + check_key(key)


def check_reason(reason: str) -> str:
    if not reason:
        raise InvalidRequest("a failed entry needs a reason")
    if len(reason) > MAX_REASON_CHARS:
        raise InvalidRequest(f"reason is {len(reason)} characters, limit {MAX_REASON_CHARS}")
    return reason


def header_from_proto(
    message: cache_pb2.EntryHeader, fingerprint: bytes, max_entry_bytes: int
) -> Header:
    """Validate a Put header against the request's fingerprint and the size limit."""
    tensor = message.tensor
    try:
        size = item_size(tensor.dtype)
    except ValueError as err:
        raise InvalidRequest(str(err)) from None
    rows, cols = message.token_count, message.hidden
    if rows <= 0 or cols <= 0:
        raise InvalidRequest(f"token_count {rows} and hidden {cols} must both be > 0")
    if list(tensor.shape) != [rows, cols]:
        raise InvalidRequest(
            f"shape {list(tensor.shape)} does not match [token_count, hidden] = [{rows}, {cols}]"
        )
    if message.fingerprint and message.fingerprint != fingerprint:
        raise InvalidRequest("header fingerprint differs from the request's fingerprint")
    nbytes = rows * cols * size
    if nbytes > max_entry_bytes:
        raise InvalidRequest(f"entry of {nbytes} bytes is over the limit of {max_entry_bytes}")
    return Header(rows, cols, tensor.dtype, tensor.checksum, fingerprint)


def header_from_stored(message: cache_pb2.EntryHeader) -> Header:
    """Rebuild a header read back from a store (trusted format, so no limits)."""
    tensor = message.tensor
    return Header(
        message.token_count, message.hidden, tensor.dtype, tensor.checksum, message.fingerprint
    )
