"""The store interface behind the cache service: memory (embedded default) or Redis (shared).

Keys are full cache keys (fingerprint ‖ item key, already checked). An embedding is stored
under its key; a failure under (key, token count), so a failure recorded for one count is
none for another. A request expecting another token count than the stored embedding's
finds nothing for itself and leaves the entry as it is. Every method is a
coroutine on the service's event loop. A store that cannot reach its backend raises
`StoreUnavailable` promptly (never hangs); bad input raises `entry.InvalidRequest`.
Reservations are atomic per item: of concurrent callers exactly one gets RESERVED.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from embedding_cache_svc.entry import Failed, Header, Status


class StoreUnavailable(Exception):
    """The backend (Redis) cannot be reached or did not answer in time."""


class EntryVanished(Exception):
    """An entry was deleted, replaced or expired while it was being read."""


@dataclass(frozen=True)
class ItemState:
    """One item's state from Reserve or a Wait probe."""

    status: Status
    reason: str = ""


@dataclass(frozen=True)
class StoreStats:
    entries: int
    bytes: int
    capacity_bytes: int
    evictions: int


@dataclass
class Reading:
    """An entry being read: its header now, its bytes as chunks of at most chunk_bytes.
    Iterating `chunks` may raise EntryVanished (or StoreUnavailable)."""

    header: Header
    chunks: AsyncIterator[bytes]


class Store(abc.ABC):
    """Where entries, failures and leases live."""

    name: str

    @abc.abstractmethod
    async def put(self, key: bytes, header: Header, data: bytes | bytearray) -> None:
        """Store an embedding (replacing anything there) and end any lease on the key.
        The servicer has checked that `data` matches `header`; stores trust it."""

    @abc.abstractmethod
    async def fail(self, key: bytes, token_count: int, reason: str) -> None:
        """Store failed(reason) for (key, token_count) with the short failed TTL and end
        any lease on the key. An embedding stored under the key is left as it is."""

    @abc.abstractmethod
    async def open(
        self, key: bytes, chunk_bytes: int, token_count: int = 0
    ) -> Reading | Failed | None:
        """Start reading the embedding when it has `token_count` rows (0: any); else the
        failure recorded for (key, token_count), else None. Nothing is deleted."""

    @abc.abstractmethod
    async def delete(self, keys: Sequence[bytes]) -> int:
        """Delete embeddings (not leases, not failures); return how many existed."""

    @abc.abstractmethod
    async def discard(self, key: bytes, header: Header) -> bool:
        """Delete the embedding under `key` only if it is still the one with `header`
        (a fresh Put since it was read is kept); return whether it was deleted."""

    @abc.abstractmethod
    async def abandon(self, keys: Sequence[bytes]) -> int:
        """End the leases on keys (not their entries); return how many were live."""

    @abc.abstractmethod
    async def exists(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether an embedding (not a failure) is stored under each key."""

    @abc.abstractmethod
    async def reserve(
        self, items: Sequence[tuple[bytes, int]], lease_ms: int, take_over: bool = False
    ) -> list[ItemState]:
        """Per (key, expected token_count), atomically: PRESENT (an embedding with that
        count), FAILED (a failure for that count), PENDING (a live lease exists) or
        RESERVED (lease granted now). An embedding with another count is no answer for
        this caller, and it is kept. With `take_over`, a live lease is no obstacle: it is
        set to `lease_ms` from now and the item is RESERVED."""

    @abc.abstractmethod
    async def probe(self, items: Sequence[tuple[bytes, int]]) -> list[ItemState]:
        """Per item: PRESENT, FAILED, PENDING (leased) or FREE, as in `reserve`. Takes no
        lease."""

    @abc.abstractmethod
    async def stats(self) -> StoreStats:
        """Sizes and cumulative evictions as the store knows them."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise StoreUnavailable unless the backend answers."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
