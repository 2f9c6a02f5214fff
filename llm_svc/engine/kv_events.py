"""KV cache events: which pages the prefix cache holds, keyed by chained block hashes.

`block_hash` = iris.multimodal.next_block_hash(parent_hash, page tokens) with the chain
rooted at the model's fingerprint, so an index built by replaying the events holds exactly
the pages the pod's radix cache holds (docs/design/gateway.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockStored:
    """A full page entered the prefix cache."""

    block_hash: bytes
    parent_hash: bytes
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class BlockRemoved:
    """A page left the prefix cache (evicted)."""

    block_hash: bytes


@dataclass(frozen=True)
class SnapshotStored:
    """Hybrid models: a cached page can now be resumed from (the linear layers' states
    after it are kept). Its BlockRemoved removes the snapshot too."""

    block_hash: bytes


@dataclass(frozen=True)
class WindowRemoved:
    """Models with sliding-window layers: a cached page lost its sliding layers' page (its
    full-attention pages stay cached). A resume point whose window needs it is no hit."""

    block_hash: bytes


@dataclass(frozen=True)
class HostStored:
    """Host tier: a cached page's KV left the device and is held in host memory only (the
    pod still holds the prefix; a hit copies it back instead of prefilling)."""

    block_hash: bytes


@dataclass(frozen=True)
class HostRemoved:
    """Host tier: a page held in host memory only is on the device again (loaded, or
    computed afresh by a sequence). A page leaving the pod altogether is a BlockRemoved."""

    block_hash: bytes


@dataclass(frozen=True)
class StoreStored:
    """KV store: a page's KV was written to the store the pods share (any pod with the
    store can fetch it; the store's own evictions are not announced)."""

    block_hash: bytes


KVEvent = (
    BlockStored
    | BlockRemoved
    | SnapshotStored
    | WindowRemoved
    | HostStored
    | HostRemoved
    | StoreStored
)


def replay(events: list[KVEvent], into: set[bytes] | None = None) -> set[bytes]:
    """Apply events in order to a set of block hashes (what a router's index would hold)."""
    held = set() if into is None else into
    for event in events:
        if isinstance(event, BlockStored):
            held.add(event.block_hash)
        elif isinstance(event, BlockRemoved):
            held.discard(event.block_hash)
    return held
