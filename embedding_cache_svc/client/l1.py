"""The client's in-process tier: a byte-bounded LRU of tensors with hold / release.

A hit returns the cached tensor itself (zero copy): callers read it and must not write to
it. An entry that is held (by one or more callers, counted) is never evicted, so a
chunked prefill that needs an image's rows across several chunks finds them every time,
whatever else the cache goes through meanwhile. Held entries may take the L1 above its
budget (correctness first); unheld ones are evicted oldest first to make room. Safe to
share between threads and an event loop (one lock, held only for dictionary work).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class _Entry:
    tensor: Any  # torch.Tensor; untyped so this module does not import torch
    token_count: int
    hidden: int
    dtype: str
    nbytes: int
    holds: int = 0


class L1Cache:
    """LRU over `capacity_bytes` of (cache key -> tensor); capacity 0 disables caching
    (hold still pins what is inserted while held)."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"L1 capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def get(self, key: bytes, token_count: int, hidden: int, dtype: str, hold: bool = False):
        """The tensor for `key` if cached with these exact properties (else None; a cached
        entry that differs is dropped unless held). `hold` pins a hit."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            if (entry.token_count, entry.hidden, entry.dtype) != (token_count, hidden, dtype):
                if not entry.holds:
                    self._remove(key)
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            if hold:
                entry.holds += 1
            self.hits += 1
            return entry.tensor

    def put(
        self, key: bytes, tensor, token_count: int, hidden: int, dtype: str, hold: bool = False
    ) -> bool:
        """Insert (replacing an unheld entry); True if it is now cached. An unheld entry
        larger than the free space after evicting all unheld entries is not cached."""
        nbytes = tensor.numel() * tensor.element_size()
        with self._lock:
            old = self._entries.get(key)
            if old is not None:
                if old.holds:
                    # Someone is assembling from the old tensor: keep it; it is equally valid.
                    old.holds += int(hold)
                    return True
                self._remove(key)
            if not hold and not self._make_room(nbytes):
                return False
            self._entries[key] = _Entry(tensor, token_count, hidden, dtype, nbytes, int(hold))
            self.bytes += nbytes
            if hold:
                self._make_room(0)  # a held entry always goes in; unheld ones make way
            return True

    def hold(self, keys: Iterable[bytes]) -> list[bytes]:
        """Pin cached keys; returns the ones that were cached (and are now held)."""
        held = []
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None:
                    entry.holds += 1
                    held.append(key)
        return held

    def release(self, keys: Iterable[bytes]) -> None:
        """Undo one hold per key; unheld entries become evictable (and are evicted now if the
        L1 is over its budget)."""
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None and entry.holds:
                    entry.holds -= 1
            self._make_room(0)

    @contextmanager
    def held(self, keys: Iterable[bytes]) -> Iterator[list[bytes]]:
        """`with l1.held(keys):` pins the cached ones for the block."""
        pinned = self.hold(keys)
        try:
            yield pinned
        finally:
            self.release(pinned)

    def holds(self, key: bytes) -> int:
        entry = self._entries.get(key)
        return entry.holds if entry else 0

    def drop(self, key: bytes) -> None:
        """Forget an unheld entry (e.g. found corrupt)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and not entry.holds:
                self._remove(key)

    def _remove(self, key: bytes) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.nbytes

    def _make_room(self, nbytes: int) -> bool:
        """Evict unheld entries, oldest first, until `nbytes` more fit; False if they can't."""
        if self.bytes + nbytes <= self.capacity_bytes:
            return True
        held_bytes = sum(entry.nbytes for entry in self._entries.values() if entry.holds)
        fits = held_bytes + nbytes <= self.capacity_bytes
        if not fits and nbytes:
            return False  # evicting would not make it fit: keep what is there
        for key in [key for key, entry in self._entries.items() if not entry.holds]:
            self._remove(key)
            self.evictions += 1
            if self.bytes + nbytes <= self.capacity_bytes:
                return True
        return False
