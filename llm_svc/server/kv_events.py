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

from llm_svc.engine import BlockStored, KVEvent
from llm_svc.engine.kv_events import SnapshotStored, WindowRemoved


@dataclass(frozen=True)
class KVRecord:
    """One numbered event: `block_hashes` stored (chained from `parent_hash`) or removed;
    with `snapshot`, held blocks that now carry a state snapshot (stored is True); with
    `window_removed`, held blocks that lost their sliding layers' page (stored is False)."""

    seq: int
    stored: bool
    block_hashes: tuple[bytes, ...]
    parent_hash: bytes = b""
    snapshot: bool = False
    window_removed: bool = False


class KVEventLog:
    """Thread-safe: `publish` from the engine thread, the rest from anywhere."""

    def __init__(self, capacity: int, on_publish: Callable[[], None] | None = None) -> None:
        self.capacity = capacity
        self.on_publish = on_publish  # called (outside the lock) after records are added
        self._records: deque[KVRecord] = deque(maxlen=capacity)
        self._hashes: set[bytes] = set()
        self._snapshots: set[bytes] = set()
        self._windowless: set[bytes] = set()
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
                if record.snapshot:
                    self._snapshots.update(record.block_hashes)
                elif record.window_removed:
                    self._windowless.update(record.block_hashes)
                elif record.stored:
                    self._hashes.update(record.block_hashes)
                else:
                    self._hashes.difference_update(record.block_hashes)
                    self._snapshots.difference_update(record.block_hashes)
                    self._windowless.difference_update(record.block_hashes)
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

    def snapshot(self) -> tuple[int, list[bytes], list[bytes], list[bytes]]:
        """(seq, every cached block hash, those that carry a state snapshot, those that lost
        their sliding layers' page) as of `seq`."""
        with self._lock:
            return self._seq, list(self._hashes), list(self._snapshots), list(self._windowless)

    def _coalesce(self, events: Sequence[KVEvent]) -> list[KVRecord]:
        records: list[KVRecord] = []
        run: list[bytes] = []
        parent = b""
        stored = None
        for event in events:
            if isinstance(event, (SnapshotStored, WindowRemoved)):
                if run:
                    records.append(self._record(stored, run, parent))
                    run = []
                snapshot = isinstance(event, SnapshotStored)
                records.append(
                    self._record(snapshot, [event.block_hash], b"", snapshot, not snapshot)
                )
                continue
            is_store = isinstance(event, BlockStored)
            chains = is_store and stored and run and event.parent_hash == run[-1]
            if run and not (chains or (not is_store and stored is False)):
                records.append(self._record(stored, run, parent))
                run = []
            if not run:
                stored = is_store
                parent = event.parent_hash if is_store else b""
            run.append(event.block_hash)
        if run:
            records.append(self._record(stored, run, parent))
        return records

    def _record(
        self,
        stored: bool,
        hashes: list[bytes],
        parent: bytes,
        snapshot: bool = False,
        window_removed: bool = False,
    ) -> KVRecord:
        self._seq += 1
        return KVRecord(self._seq, stored, tuple(hashes), parent, snapshot, window_removed)
