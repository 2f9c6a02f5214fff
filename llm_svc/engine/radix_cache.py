"""Radix prefix cache over full KV pages, keyed by token ids.

Each node is one page of `page_size` tokens; a path from the root spells a prefix. A node
carries its chained block hash (iris.multimodal.next_block_hash over its parent's), a
reference count (running sequences using the page) and a last-use tick. Pages nobody
references stay cached until they are evicted, least recently used leaf first. Every
insertion and eviction is recorded as a KV event.

There is one tree (namespace) per tenant salt, rooted at root_hash(fingerprint, salt): the
tokens are the key, so only separate trees keep tenants with the same prompt from sharing
pages, and their block hashes (hence KV events and the gateway's index) differ as well.
A salted tree that loses its last page is dropped; the shared one (salt b"") stays.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from iris.multimodal import next_block_hash, root_hash
from llm_svc.engine.kv_events import BlockRemoved, BlockStored, KVEvent


class RadixNode:
    __slots__ = ("key", "page", "block_hash", "parent", "children", "ref", "last_used")

    def __init__(self, key: tuple[int, ...], page: int, block_hash: bytes, parent) -> None:
        self.key = key
        self.page = page
        self.block_hash = block_hash
        self.parent: RadixNode | None = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.ref = 0
        self.last_used = 0


class RadixCache:
    """Pages shared by prefix. `match` / `insert` / `acquire` / `release` / `evict`."""

    def __init__(self, page_size: int, fingerprint: bytes) -> None:
        self.page_size = page_size
        self.fingerprint = fingerprint
        self.roots: dict[bytes, RadixNode] = {}
        self.root = self.root_for(b"")  # the shared namespace
        self.num_nodes = 0
        self.num_unreferenced = 0
        self.events: list[KVEvent] = []
        self._clock = itertools.count(1)

    def root_for(self, salt: bytes) -> RadixNode:
        """The root of `salt`'s namespace (b"": the shared one), made on first use."""
        root = self.roots.get(salt)
        if root is None:
            root = RadixNode((), -1, root_hash(self.fingerprint, salt or None), None)
            root.ref = 1  # never evicted
            self.roots[salt] = root
        return root

    def match(self, token_ids: Sequence[int], salt: bytes = b"") -> list[RadixNode]:
        """The nodes of the longest cached prefix of `token_ids` in `salt`'s namespace."""
        nodes, size = [], self.page_size
        node = self.roots.get(salt)
        if node is None:
            return nodes
        for start in range(0, len(token_ids) - size + 1, size):
            node = node.children.get(tuple(token_ids[start : start + size]))
            if node is None:
                break
            nodes.append(node)
        return nodes

    def insert(
        self, parent: RadixNode | None, tokens: Sequence[int], page: int, salt: bytes = b""
    ) -> tuple[RadixNode, bool]:
        """Add page `page` holding `tokens` under `parent` (None = the root of `salt`'s
        namespace), referenced once.

        If that prefix is already cached, returns the cached node (not referenced) and False:
        the caller keeps using the cached page and frees its own copy.
        """
        parent = parent or self.root_for(salt)
        key = tuple(tokens)
        assert len(key) == self.page_size, "only full pages enter the cache"
        existing = parent.children.get(key)
        if existing is not None:
            return existing, False
        node = RadixNode(key, page, next_block_hash(parent.block_hash, key), parent)
        node.ref, node.last_used = 1, next(self._clock)
        parent.children[key] = node
        self.num_nodes += 1
        self.events.append(BlockStored(node.block_hash, parent.block_hash, key))
        return node, True

    def acquire(self, nodes: Sequence[RadixNode]) -> None:
        tick = next(self._clock)
        for node in nodes:
            if node.ref == 0:
                self.num_unreferenced -= 1
            node.ref += 1
            node.last_used = tick

    def release(self, nodes: Sequence[RadixNode]) -> None:
        tick = next(self._clock)
        for node in nodes:
            assert node.ref > 0, "released a page nobody holds"
            node.ref -= 1
            node.last_used = tick
            if node.ref == 0:
                self.num_unreferenced += 1

    def evict(self, count: int) -> list[int]:
        """Free up to `count` unreferenced pages, least recently used leaves first.

        A sequence holding a node holds its whole path, so every unreferenced node is
        reachable this way and `num_unreferenced` pages can always be freed.
        """
        heap = [(n.last_used, id(n), n) for n in self._leaves() if n.ref == 0]
        heapq.heapify(heap)
        freed = []
        while heap and len(freed) < count:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[node.key]
            self.num_nodes -= 1
            self.num_unreferenced -= 1
            freed.append(node.page)
            self.events.append(BlockRemoved(node.block_hash))
            if parent.parent is not None and parent.ref == 0 and not parent.children:
                heapq.heappush(heap, (parent.last_used, id(parent), parent))
        self._drop_empty_namespaces()
        return freed

    def _drop_empty_namespaces(self) -> None:
        # Salts are per tenant (or per request in the no-reuse mode): an empty tree would
        # otherwise stay for good.
        for salt in [s for s, root in self.roots.items() if s and not root.children]:
            del self.roots[salt]

    def take_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events

    def block_hashes(self) -> set[bytes]:
        """Hashes of every cached page (for checks against an index built from events)."""
        return {node.block_hash for node in self._nodes()}

    def pages(self) -> set[int]:
        return {node.page for node in self._nodes()}

    def _nodes(self):
        stack = [node for root in self.roots.values() for node in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _leaves(self):
        return (node for node in self._nodes() if not node.children)
