"""The embedded store: an LRU of entries under a byte budget, plus leases, in this process.

Everything runs on the service's event loop, so each method is atomic without locks.
Expiry (entry TTL, failed TTL, leases) is checked lazily when a key is touched. Failures
live in the same LRU under `_failure_key(key, token_count)`.
"""

from __future__ import annotations

import heapq
import struct
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from embedding_cache_svc.entry import Failed, Header, InvalidRequest, Status
from embedding_cache_svc.store.base import (
    ItemState,
    Reading,
    Store,
    StoreStats,
)


@dataclass
class _Slot:
    value: tuple[Header, bytes | bytearray] | Failed
    size: int
    expires_at: float  # monotonic seconds; 0 = never


def _failure_key(key: bytes, token_count: int) -> bytes:
    # Cache keys are 40 or 64 bytes, so a 45- or 69-byte failure key never equals one.
    return key + b"#" + struct.pack("<I", token_count)


class MemoryStore(Store):
    """LRU under `capacity_bytes`; entries live `ttl_s` (0 = forever), failures `failed_ttl_s`.
    `clock` is monotonic seconds (tests pass one they move by hand)."""

    name = "memory"

    def __init__(
        self,
        capacity_bytes: int,
        ttl_s: float,
        failed_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._capacity = capacity_bytes
        self._ttl_s = ttl_s
        self._failed_ttl_s = failed_ttl_s
        self._slots: OrderedDict[bytes, _Slot] = OrderedDict()
        self._leases: dict[bytes, float] = {}
        # (expiry, key) of every lease granted: expired ones are swept at each reservation,
        # so a dead holder's lease does not stay until its key is asked for again.
        self._lease_expiries: list[tuple[float, bytes]] = []
        self._bytes = 0
        self._evictions = 0

    # --- internals -------------------------------------------------------------------
    def _live(self, key: bytes) -> _Slot | None:
        slot = self._slots.get(key)
        if slot is not None and slot.expires_at and slot.expires_at <= self._clock():
            self._remove(key)
            return None
        return slot

    def _remove(self, key: bytes) -> bool:
        slot = self._slots.pop(key, None)
        if slot is None:
            return False
        self._bytes -= slot.size
        return True

    def _insert(self, key: bytes, slot: _Slot) -> None:
        if slot.size > self._capacity:
            raise InvalidRequest(
                f"entry of {slot.size} bytes is over the memory store capacity of "
                f"{self._capacity} bytes"
            )
        self._remove(key)
        while self._bytes + slot.size > self._capacity:
            _, evicted = self._slots.popitem(last=False)
            self._bytes -= evicted.size
            self._evictions += 1
        self._slots[key] = slot
        self._bytes += slot.size
        self._leases.pop(key, None)

    def _lease_live(self, key: bytes, now: float) -> bool:
        expires = self._leases.get(key)
        if expires is None:
            return False
        if expires <= now:
            del self._leases[key]
            return False
        return True

    def _embedding(self, key: bytes, token_count: int) -> tuple[Header, bytes | bytearray] | None:
        """The embedding under `key` if it has `token_count` rows (0: any)."""
        slot = self._live(key)
        if slot is None or isinstance(slot.value, Failed):
            return None
        if token_count and slot.value[0].token_count != token_count:
            return None  # another count: no answer for this caller, kept for the others
        self._slots.move_to_end(key)
        return slot.value

    def _failure(self, key: bytes, token_count: int) -> Failed | None:
        slot = self._live(_failure_key(key, token_count))
        return slot.value if slot is not None and isinstance(slot.value, Failed) else None

    def _state(self, key: bytes, token_count: int) -> ItemState | None:
        """PRESENT / FAILED for what is stored for (key, token_count), else None."""
        if self._embedding(key, token_count) is not None:
            return ItemState(Status.PRESENT)
        failure = self._failure(key, token_count)
        return None if failure is None else ItemState(Status.FAILED, failure.reason)

    def _expiry(self, ttl_s: float) -> float:
        return self._clock() + ttl_s if ttl_s else 0.0

    # --- Store -----------------------------------------------------------------------
    async def put(self, key: bytes, header: Header, data: bytes | bytearray) -> None:
        self._insert(key, _Slot((header, data), len(data), self._expiry(self._ttl_s)))
        self._remove(_failure_key(key, header.token_count))

    async def fail(self, key: bytes, token_count: int, reason: str) -> None:
        size = len(reason.encode())
        slot = _Slot(Failed(reason), size, self._expiry(self._failed_ttl_s))
        self._insert(_failure_key(key, token_count), slot)
        self._leases.pop(key, None)

    async def open(
        self, key: bytes, chunk_bytes: int, token_count: int = 0
    ) -> Reading | Failed | None:
        value = self._embedding(key, token_count)
        if value is None:
            return self._failure(key, token_count)
        header, data = value
        return Reading(header, _chunks(data, chunk_bytes))

    async def delete(self, keys: Sequence[bytes]) -> int:
        return sum(self._remove(key) for key in keys)

    async def discard(self, key: bytes, header: Header) -> bool:
        value = self._embedding(key, 0)
        return value is not None and value[0] == header and self._remove(key)

    async def abandon(self, keys: Sequence[bytes]) -> int:
        now = self._clock()
        live = [key for key in keys if self._lease_live(key, now)]
        for key in keys:
            self._leases.pop(key, None)
        return len(live)

    async def exists(self, keys: Sequence[bytes]) -> list[bool]:
        out = []
        for key in keys:
            slot = self._live(key)
            out.append(slot is not None and not isinstance(slot.value, Failed))
        return out

    async def reserve(
        self, items: Sequence[tuple[bytes, int]], lease_ms: int, take_over: bool = False
    ) -> list[ItemState]:
        return self._states(items, lease_ms, take_over)

    async def probe(self, items: Sequence[tuple[bytes, int]]) -> list[ItemState]:
        return self._states(items, None)

    def _states(
        self, items: Sequence[tuple[bytes, int]], lease_ms: int | None, take_over: bool = False
    ) -> list[ItemState]:
        """Each item's state; with `lease_ms`, an item neither stored nor leased (with
        `take_over`: leased or not) is leased to the caller (RESERVED), else it is FREE."""
        now = self._clock()
        self._sweep_leases(now)
        out = []
        for key, token_count in items:
            state = self._state(key, token_count)
            if state is not None:
                out.append(state)
            elif self._lease_live(key, now) and not (take_over and lease_ms is not None):
                out.append(ItemState(Status.PENDING))
            elif lease_ms is None:
                out.append(ItemState(Status.FREE))
            else:
                expires = self._leases[key] = now + lease_ms / 1000
                heapq.heappush(self._lease_expiries, (expires, key))
                out.append(ItemState(Status.RESERVED))
        return out

    def _sweep_leases(self, now: float) -> None:
        expiries = self._lease_expiries
        while expiries and expiries[0][0] <= now:
            expires, key = heapq.heappop(expiries)
            if self._leases.get(key) == expires:  # not renewed, filled or given back since
                del self._leases[key]

    async def stats(self) -> StoreStats:
        return StoreStats(len(self._slots), self._bytes, self._capacity, self._evictions)

    async def ping(self) -> None:
        return None


async def _chunks(data: bytes | bytearray, chunk_bytes: int) -> AsyncIterator[bytes]:
    # The slot may be evicted while a reader is here; `data` stays alive through this
    # reference, so a reader never sees bytes change under it.
    view = memoryview(data)
    for start in range(0, len(data), chunk_bytes):
        yield bytes(view[start : start + chunk_bytes])
