"""Between the prefix cache and the shared KV store (llm_svc/engine/kv_store.py).

Writes: every unit the pod computes is written once, when it is published to the radix
tree (a full page, the window page beside it, a hybrid model's snapshot), read by the
store's writer thread from the device pool, not on the step path. Pages are written when
computed, not when they reach the host tier: a pod that never runs short of device pages
would otherwise write nothing, and the next turn of its conversations could not move to
another pod. A unit that leaves the device before the writer reads it is skipped (its
device buffer's generation moved, `HostTier.left`).

Reads (`fetch_into`): once per sequence, when the device and host tiers hold less of its
prompt than the resume rule could use, the next pages' units are looked up in the store,
chained from the deepest page held, and those present are put in the host tier as host-only
nodes of the tree (BlockStored: the pod now holds them); the block manager then loads them
as any host hit.
"""

from __future__ import annotations

from iris.multimodal import next_block_hash
from llm_svc.engine.host_tier import PAGE, STATE, WINDOW, HostTier
from llm_svc.engine.kv_store import KVStoreClient, PendingWrite, unit_key
from llm_svc.engine.radix_cache import RadixCache, RadixNode
from llm_svc.engine.sequence import Sequence


class StoreLink:
    """`published` / `fetch_into`, for one pod (tensor parallelism is refused with a store)."""

    def __init__(self, client: KVStoreClient, host: HostTier, fingerprint: bytes) -> None:
        self.client = client
        self.host = host
        self.fingerprint = fingerprint
        self.tp = (1, 0)

    def key(self, salt: bytes, kind: str, block_hash: bytes) -> bytes:
        return unit_key(self.fingerprint, salt, kind, self.tp, block_hash)

    def published(self, node: RadixNode, kind: str, device_index: int, salt: bytes) -> None:
        """Queue device unit `device_index` of `node` for the store."""
        host, generations = self.host, self.host.generations[kind]
        generation = generations[device_index]
        self.client.write(
            PendingWrite(
                self.key(salt, kind, node.block_hash),
                read=lambda: host.device_bytes(kind, device_index),
                still_valid=lambda: generations[device_index] == generation,
                announce=node.block_hash if kind == PAGE else None,
            )
        )

    def fetch_into(
        self,
        cache: RadixCache,
        seq: Sequence,
        most: int,
        windows: bool,
        snapshot_every: int | None,
    ) -> int:
        """Look up `seq`'s pages after the deepest one the tree holds, up to `most` pages,
        and put those found in the host tier; returns how many pages were added."""
        size, salt = cache.page_size, seq.cache_salt
        held = cache.match(seq.token_ids[: most * size], salt)
        if len(held) >= most or not self.client.usable:
            return 0
        parent = held[-1] if held else cache.root_for(salt)
        pages, keys, block_hash = [], [], parent.block_hash
        for index in range(len(held), most):
            tokens = tuple(seq.token_ids[index * size : (index + 1) * size])
            block_hash = next_block_hash(block_hash, tokens)
            kinds = [PAGE]
            if windows:
                kinds.append(WINDOW)
            if snapshot_every and (index + 1) % snapshot_every == 0:
                kinds.append(STATE)
            pages.append((tokens, kinds))
            keys.append([self.key(salt, kind, block_hash) for kind in kinds])
        found = self.client.fetch(keys)
        added: list[RadixNode] = []
        for (tokens, kinds), payloads in zip(pages, found, strict=False):
            units = {kind: payload for kind, payload in zip(kinds, payloads, strict=True)}
            node = cache.insert_host(parent, tokens, salt, units)
            if node is None:  # no room in the host tier, or a unit of the wrong size
                break
            added.append(node)
            parent = node
        cache.unpin(added)
        return len(added)
