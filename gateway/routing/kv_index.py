"""Which pod holds which prefix blocks (docs/design/gateway.md).

Per pod, a set of chained block hashes, and (a hybrid model) those of them that carry a
linear-state snapshot: only there can the pod resume (`has_snapshot`), and (a model with
sliding layers) those that lost their sliding page (`has_window`), and (a pod with a host
tier) those whose KV is in host memory only (`device_blocks` stops at them). Fleet-wide,
the blocks some pod wrote to the shared KV store (`store_blocks`): a bounded LRU, since
the store's own evictions are not announced. A pod that
publishes KV events is *precise*: a snapshot (`load_snapshot`) sets its blocks and sequence
number, then events are applied in sequence order; a gap (a missed event) makes `apply`
return False and the caller fetches a new snapshot. A pod that gives no events falls back
to the gateway's own routing decisions (`record_decision`), kept as a bounded LRU since
nothing tells us what the pod evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum


class Source(Enum):
    DECISIONS = "decisions"
    EVENTS = "events"


@dataclass
class KVEventRecord:
    """One KV event, decoupled from the wire type (llm.KVEvent)."""

    seq: int
    stored: bool
    block_hashes: Sequence[bytes]
    snapshot: bool = False  # the blocks now carry a state snapshot (stored is True)
    window_removed: bool = False  # held blocks lost their sliding page (stored is False)
    # A tier move of held blocks: "host" (stored: in host memory only now; not stored: on
    # the device again) or "store" (stored: written to the shared KV store); "" otherwise.
    tier: str = ""


@dataclass
class _PodBlocks:
    source: Source = Source.DECISIONS
    seq: int = 0
    blocks: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    snapshots: set[bytes] = field(default_factory=set)
    windowless: set[bytes] = field(default_factory=set)
    host: set[bytes] = field(default_factory=set)


class KVIndex:
    """Per-pod block sets; `matched_blocks` answers the prefix query routing asks."""

    def __init__(self, max_decision_blocks: int = 200_000, max_store_blocks: int = 500_000) -> None:
        self.max_decision_blocks = max_decision_blocks
        self.max_store_blocks = max_store_blocks
        self._pods: dict[str, _PodBlocks] = {}
        self._store: OrderedDict[bytes, None] = OrderedDict()

    def _pod(self, pod: str) -> _PodBlocks:
        return self._pods.setdefault(pod, _PodBlocks())

    def source(self, pod: str) -> Source:
        return self._pod(pod).source

    def seq(self, pod: str) -> int:
        return self._pod(pod).seq

    def blocks(self, pod: str) -> set[bytes]:
        return set(self._pod(pod).blocks)

    def host_blocks(self, pod: str) -> set[bytes]:
        """The pod's blocks whose KV is in its host memory only."""
        return set(self._pod(pod).host)

    def holds_in_host(self, pod: str) -> bool:
        """Whether the pod holds any block in host memory only."""
        state = self._pods.get(pod)
        return state is not None and bool(state.host)

    def matched_blocks(self, pod: str, hashes: Sequence[bytes], limit: int | None = None) -> int:
        """How many leading blocks of `hashes` the pod holds (the chain stops at a miss),
        at most `limit` (the blocks the pod may resume: iris.multimodal.PrefixResumeRule)."""
        state = self._pods.get(pod)
        if state is None:
            return 0
        return _leading(hashes[:limit], state.blocks.__contains__)

    def device_blocks(self, pod: str, hashes: Sequence[bytes], limit: int | None = None) -> int:
        """How many leading blocks of `hashes` the pod holds on its device (the chain stops
        at a block it does not hold, or holds in host memory only)."""
        state = self._pods.get(pod)
        if state is None:
            return 0
        blocks, host = state.blocks, state.host
        return _leading(hashes[:limit], lambda block: block in blocks and block not in host)

    def store_blocks(self, hashes: Sequence[bytes], limit: int | None = None) -> int:
        """How many leading blocks of `hashes` some pod wrote to the shared KV store (as far
        as this gateway heard; the store may have let some go since)."""
        return _leading(hashes[:limit], self._store.__contains__)

    def has_snapshot(self, pod: str, block: bytes) -> bool:
        """Whether the pod holds a state snapshot after `block` (a hybrid model). A pod
        known only from decisions is assumed to (nothing says otherwise)."""
        state = self._pods.get(pod)
        if state is None:
            return False
        return state.source is Source.DECISIONS or block in state.snapshots

    def has_window(self, pod: str, block: bytes) -> bool:
        """Whether the pod still holds `block`'s sliding-layer page (a model with sliding
        layers); assumed of a pod known only from decisions."""
        state = self._pods.get(pod)
        return state is not None and block not in state.windowless

    def load_snapshot(
        self,
        pod: str,
        seq: int,
        hashes: Iterable[bytes],
        snapshot_hashes: Iterable[bytes] = (),
        windowless_hashes: Iterable[bytes] = (),
        host_hashes: Iterable[bytes] = (),
    ) -> None:
        """Replace the pod's blocks (and those with a state snapshot, those without their
        sliding page, those in host memory only) with a snapshot taken at `seq`; the pod is
        now precise."""
        state = self._pod(pod)
        state.source = Source.EVENTS
        state.seq = seq
        state.blocks = OrderedDict.fromkeys(hashes)
        state.snapshots = set(snapshot_hashes)
        state.windowless = set(windowless_hashes)
        state.host = set(host_hashes)

    def apply(self, pod: str, events: Iterable[KVEventRecord]) -> bool:
        """Apply events in order; False on a gap (nothing after it applied: resnapshot)."""
        state = self._pod(pod)
        if state.source is not Source.EVENTS:
            return False
        for event in events:
            if event.seq <= state.seq:
                continue  # already covered by the snapshot or a previous batch
            if event.seq != state.seq + 1:
                return False
            if event.tier == "store":
                self._stored(event.block_hashes)
            elif event.tier == "host":
                if event.stored:
                    state.host.update(b for b in event.block_hashes if b in state.blocks)
                else:
                    state.host.difference_update(event.block_hashes)
            elif event.snapshot:
                state.snapshots.update(event.block_hashes)
            elif event.window_removed:
                state.windowless.update(event.block_hashes)
            elif event.stored:
                for block in event.block_hashes:
                    state.blocks[block] = None
            else:
                for block in event.block_hashes:
                    state.blocks.pop(block, None)
                    state.snapshots.discard(block)
                    state.windowless.discard(block)
                    state.host.discard(block)
            state.seq = event.seq
        return True

    def _stored(self, hashes: Iterable[bytes]) -> None:
        store = self._store
        for block in hashes:
            store[block] = None
            store.move_to_end(block)
        while len(store) > self.max_store_blocks:
            store.popitem(last=False)

    def fall_back(self, pod: str) -> None:
        """The pod's event stream is gone: keep what we know, learn from our decisions."""
        self._pod(pod).source = Source.DECISIONS

    def record_decision(self, pod: str, hashes: Sequence[bytes]) -> None:
        """Remember that a prompt with these blocks went to the pod (decision mode only)."""
        state = self._pod(pod)
        if state.source is not Source.DECISIONS:
            return
        blocks = state.blocks
        for block in hashes:
            blocks[block] = None
            blocks.move_to_end(block)
        while len(blocks) > self.max_decision_blocks:
            blocks.popitem(last=False)

    def forget(self, pod: str) -> None:
        """Drop a pod that left (or was refused)."""
        self._pods.pop(pod, None)


def _leading(hashes: Sequence[bytes], present) -> int:
    """How many of `hashes`, from the first, `present` says yes to (a chain: it stops at the
    first no)."""
    count = 0
    for block in hashes:
        if not present(block):
            break
        count += 1
    return count
