"""Where the encoder's results go: the embedding cache, seen through the three calls the
encoder makes. `CacheSink` adapts the cache service's client to it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class EmbeddingSink(Protocol):
    """The encoder's view of the embedding cache (all keys under the model's fingerprint)."""

    async def claim(self, items: Sequence[tuple[bytes, int]], lease_ms: int) -> list[bool]:
        """Take over the lease on each (key, token_count) that is not stored yet, for
        `lease_ms` from now, and return, per item, whether an embedding is already stored
        (then nothing is to do). A lease held by someone else (the gateway that sent the
        item here) is taken over: the item is ours to encode, and our put or fail ends
        the lease. Called again while the work runs, it extends the leases."""

    async def put(self, key: bytes, tensor: Any, token_count: int) -> None:
        """Store one embedding [token_count, hidden] (ends any lease on the key)."""

    async def fail(self, key: bytes, reason: str, token_count: int) -> None:
        """Store failed(reason) for (key, token_count) (ends any lease on the key)."""

    async def abandon(self, keys: Sequence[bytes]) -> None:
        """End the leases on `keys` without storing anything (a put that failed)."""


class CacheSink:
    """`EmbeddingSink` over the embedding cache service's async client. With `dtype` (a
    torch dtype) embeddings are stored in it rather than the tower's own; readers convert
    to theirs on read either way."""

    def __init__(self, client: Any, dtype: Any = None) -> None:
        self._client = client
        self._dtype = dtype

    async def claim(self, items: Sequence[tuple[bytes, int]], lease_ms: int) -> list[bool]:
        from embedding_cache_svc.proto import cache_pb2

        states = await self._client.reserve(list(items), lease_ms, take_over=True)
        return [_status(state) == cache_pb2.PRESENT for state in states]

    async def put(self, key: bytes, tensor: Any, token_count: int) -> None:
        if self._dtype is not None and tensor.dtype != self._dtype:
            tensor = tensor.to(self._dtype)
        await self._client.put(key, tensor, token_count)

    async def fail(self, key: bytes, reason: str, token_count: int) -> None:
        await self._client.fail(key, reason, token_count)

    async def abandon(self, keys: Sequence[bytes]) -> None:
        await self._client.abandon(list(keys))


def _status(state: Any) -> int:
    return getattr(state, "status", state)
