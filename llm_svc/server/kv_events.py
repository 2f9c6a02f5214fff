"""The pod's KV event log: numbered events for subscribers, and a snapshot to resync from.

The engine thread publishes the prefix cache's BlockStored / BlockRemoved / SnapshotStored /
WindowRemoved events after each step (a hybrid model's snapshot leaves with its block, so a
removal removes both; a block that lost its sliding layers' page stays held, windowless).
Each published record gets the next sequence number (from 1); a run of stores that chain one
onto the next (or a run of removals) becomes one record with several hashes.
The log keeps the last `capacity` records and the set of hashes they add up to, so
`snapshot()` returns (seq, hashes) atomically: replaying records after `seq` onto `hashes`
gives the cache's state. A subscriber whose next record is not `seq + 1` missed some and
resyncs from a snapshot.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from llm_svc.engine import BlockStored, KVEvent
from llm_svc.engine.kv_events import (
    HostRemoved,
    HostStored,
    SnapshotStored,
    StoreStored,
    WindowRemoved,
)


@dataclass(frozen=True)
class KVRecord:
    """One numbered event: `block_hashes` stored (chained from `parent_hash`) or removed;
    with `snapshot`, held blocks that now carry a state snapshot (stored is True); with
    `window_removed`, held blocks that lost their sliding layers' page (stored is False);
    with `tier`, a tier move of held blocks (see the field)."""

    seq: int
    stored: bool
    block_hashes: tuple[bytes, ...]
    parent_hash: bytes = b""
    snapshot: bool = False
    window_removed: bool = False
    # A tier move of held blocks: "host" (stored: now in host memory only; not stored: back
    # on the device) or "store" (stored: written to the shared KV store). "" otherwise.
    tier: str = ""


class KVLogSnapshot(NamedTuple):
    seq: int
    hashes: list[bytes]
    snapshots: list[bytes]
    windowless: list[bytes]
    host: list[bytes]


class KVEventLog:
    """Thread-safe: `publish` from the engine thread, the rest from anywhere."""

    def __init__(self, capacity: int, on_publish: Callable[[], None] | None = None) -> None:
        self.capacity = capacity
        self.on_publish = on_publish  # called (outside the lock) after records are added
        self._records: deque[KVRecord] = deque(maxlen=capacity)
        self._hashes: set[bytes] = set()
        self._snapshots: set[bytes] = set()
        self._windowless: set[bytes] = set()
        self._host: set[bytes] = set()
        self._seq = 0
        self._lock = threading.Lock()

    @property
    def seq(self) -> int:
        """The number of the last record published (0 before any)."""
        return self._seq

    def publish(self, events: Sequence[KVEvent]) -> int:
        """Number and keep `events` (in order); returns how many records they became."""
        if not events:
            return 0
        with self._lock:
            records = self._coalesce(events)
            for record in records:
                self._records.append(record)
                if record.tier == "host":
                    held = self._hashes.intersection(record.block_hashes)
                    if record.stored:
                        self._host.update(held)
                    else:
                        self._host.difference_update(record.block_hashes)
                elif record.tier:
                    pass  # the store is the fleet's, not this pod's state
                elif record.snapshot:
                    self._snapshots.update(record.block_hashes)
                elif record.window_removed:
                    self._windowless.update(record.block_hashes)
                elif record.stored:
                    self._hashes.update(record.block_hashes)
                else:
                    self._hashes.difference_update(record.block_hashes)
                    self._snapshots.difference_update(record.block_hashes)
                    self._windowless.difference_update(record.block_hashes)
                    self._host.difference_update(record.block_hashes)
        if self.on_publish is not None:
            self.on_publish()
        return len(records)

    def since(self, seq: int, limit: int | None = None) -> list[KVRecord]:
        """Kept records numbered after `seq`, oldest first. If the log no longer holds
        seq + 1, the first record returned is later: the caller sees the gap."""
        with self._lock:
            if not self._records or seq >= self._seq:
                return []
            first = self._records[0].seq
            start = max(0, seq + 1 - first)
            stop = len(self._records) if limit is None else min(len(self._records), start + limit)
            return list(itertools.islice(self._records, start, stop))

    def snapshot(self) -> KVLogSnapshot:
        """Every cached block hash as of `seq`, with those that carry a state snapshot,
        those that lost their sliding layers' page, those held in host memory only."""
        with self._lock:
            return KVLogSnapshot(
                self._seq, list(self._hashes), list(self._snapshots), list(self._windowless),
                list(self._host),
            )  # fmt: skip

    def _coalesce(self, events: Sequence[KVEvent]) -> list[KVRecord]:
        records: list[KVRecord] = []
        run: list[bytes] = []
        parent = b""
        stored = None
        tier = ""
        for event in events:
            if isinstance(event, (SnapshotStored, WindowRemoved)):
                if run:
                    records.append(self._record(stored, run, parent, tier=tier))
                    run = []
                snapshot = isinstance(event, SnapshotStored)
                records.append(
                    self._record(snapshot, [event.block_hash], b"", snapshot, not snapshot)
                )
                continue
            event_tier = _TIERS.get(type(event), "")
            is_store = isinstance(event, (BlockStored, HostStored, StoreStored))
            if event_tier:  # a run of one kind of tier move
                same = run and tier == event_tier and stored == is_store
            else:
                chains = is_store and stored and event.parent_hash == run[-1] if run else False
                same = run and not tier and (chains or (not is_store and stored is False))
            if run and not same:
                records.append(self._record(stored, run, parent, tier=tier))
                run = []
            if not run:
                stored, tier = is_store, event_tier
                parent = event.parent_hash if isinstance(event, BlockStored) else b""
            run.append(event.block_hash)
        if run:
            records.append(self._record(stored, run, parent, tier=tier))
        return records

    def _record(
        self,
        stored: bool,
        hashes: list[bytes],
        parent: bytes,
        snapshot: bool = False,
        window_removed: bool = False,
        tier: str = "",
    ) -> KVRecord:
        self._seq += 1
        return KVRecord(self._seq, stored, tuple(hashes), parent, snapshot, window_removed, tier)


# Tier moves (the blocks stay held): a record's `tier`, "host" or "store".
_TIERS = {HostStored: "host", HostRemoved: "host", StoreStored: "store"}
