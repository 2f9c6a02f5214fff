"""Radix prefix cache over full KV pages, keyed by token ids.

Each node is one page of `page_size` tokens; a path from the root spells a prefix. A node
carries its chained block hash (iris.multimodal.next_block_hash over its parent's), a
reference count (running sequences using the page) and a last-use tick. Pages nobody
references stay cached until they are evicted, least recently released leaf first. Every
insertion and eviction is recorded as a KV event.

There is one tree (namespace) per tenant salt, rooted at root_hash(fingerprint, salt): the
tokens are the key, so only separate trees keep tenants with the same prompt from sharing
pages, and their block hashes (hence KV events and the gateway's index) differ as well.
A salted tree that loses its last page is dropped; the shared one (salt b"") stays.

Hybrid models (linear attention) need more than KV to resume: a node may carry a snapshot,
the StatePool slot holding the linear layers' states after its page (`attach_snapshot`),
which leaves with the node when it is evicted (`snapshot_freed` gives the slot back).

Models with sliding-window layers: a node may also carry `window_page`, its page in the
sliding layers' pool, with a reference count of its own (`window_ref`: running sequences
whose window still covers it). A window page nobody references waits in a second queue,
least recently released first, and `evict_windows(k)` takes it from any depth (not only
leaves: losing it only removes the resume points whose window needed it, see
iris.multimodal.PrefixResumeRule), recorded as WindowRemoved. A node that leaves the tree
takes its window page with it (`window_freed` gives it back to its pool).

Cost: every operation touches only the nodes it is given or returns. The evictable leaves
(unreferenced, childless) sit in a doubly linked list threaded through the nodes
themselves (`prev` / `next`), which each change of a node's reference count or children
updates in O(1), as vLLM's free-block queue does, so
`evict(k)` pops k of them in O(k) whatever the cache's size (docs/design/engine.md, "Prefix
cache eviction order"). `visited` counts the nodes each operation touches, so a test can
show that no step-path operation walks the tree.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from iris.multimodal import next_block_hash, root_hash
from llm_svc.engine.kv_events import (
    BlockRemoved,
    BlockStored,
    KVEvent,
    SnapshotStored,
    WindowRemoved,
)


class RadixNode:
    __slots__ = (
        "key", "page", "block_hash", "parent", "children", "ref", "last_used", "salt",
        "prev", "next", "snapshot", "window_page", "window_ref", "wprev", "wnext",
    )  # fmt: skip

    def __init__(self, key: tuple[int, ...], page: int, block_hash: bytes, parent) -> None:
        self.key = key
        self.page = page
        self.block_hash = block_hash
        self.parent: RadixNode | None = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.ref = 0
        self.last_used = 0
        self.salt: bytes | None = None  # set on roots only: the namespace they root
        # Neighbours in the cache's eviction queue; None when not queued.
        self.prev: RadixNode | None = None
        self.next: RadixNode | None = None
        self.snapshot: int | None = None  # hybrid models: a StatePool slot
        self.window_page: int | None = None  # sliding layers' page (None: none, or gone)
        self.window_ref = 0
        # Neighbours in the window-page queue; None when not queued.
        self.wprev: RadixNode | None = None
        self.wnext: RadixNode | None = None


class RadixCache:
    """Pages shared by prefix. `match` / `insert` / `acquire` / `release` / `evict`."""

    def __init__(
        self,
        page_size: int,
        fingerprint: bytes,
        snapshot_freed: Callable[[int], None] | None = None,
        window_freed: Callable[[int], None] | None = None,
    ) -> None:
        self.page_size = page_size
        self.snapshot_freed = snapshot_freed
        self.window_freed = window_freed
        self.fingerprint = fingerprint
        self.roots: dict[bytes, RadixNode] = {}
        self.root = self.root_for(b"")  # the shared namespace
        self.num_nodes = 0
        self.num_unreferenced = 0
        self.num_window_unreferenced = 0
        self.events: list[KVEvent] = []
        self.visited = 0  # nodes touched by every operation so far (for cost tests)
        self._clock = itertools.count(1)
        # The eviction queue's sentinel: head.next is evicted first, head.prev queued last.
        head = self._queue = RadixNode((), -1, b"", None)
        head.prev = head.next = head
        wins = self._window_queue = RadixNode((), -1, b"", None)
        wins.wprev = wins.wnext = wins

    def root_for(self, salt: bytes) -> RadixNode:
        """The root of `salt`'s namespace (b"": the shared one), made on first use."""
        root = self.roots.get(salt)
        if root is None:
            root = RadixNode((), -1, root_hash(self.fingerprint, salt or None), None)
            root.ref = 1  # never evicted
            root.salt = salt
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
        self.visited += len(nodes) + 1
        return nodes

    def insert(
        self,
        parent: RadixNode | None,
        tokens: Sequence[int],
        page: int,
        salt: bytes = b"",
        window_page: int | None = None,
    ) -> tuple[RadixNode, bool]:
        """Add page `page` holding `tokens` under `parent` (None = the root of `salt`'s
        namespace), referenced once, with its sliding layers' `window_page` (if any, also
        referenced once).

        If that prefix is already cached, returns the cached node (not referenced) and False:
        the caller keeps using the cached page and frees its own copy.
        """
        parent = parent or self.root_for(salt)
        key = tuple(tokens)
        assert len(key) == self.page_size, "only full pages enter the cache"
        self.visited += 1
        existing = parent.children.get(key)
        if existing is not None:
            return existing, False
        node = RadixNode(key, page, next_block_hash(parent.block_hash, key), parent)
        node.ref, node.last_used = 1, next(self._clock)
        if window_page is not None:
            node.window_page, node.window_ref = window_page, 1
        if parent.prev is not None:
            _unlink(parent)  # no longer a leaf
        parent.children[key] = node
        self.num_nodes += 1
        self.events.append(BlockStored(node.block_hash, parent.block_hash, key))
        return node, True

    def attach_snapshot(self, node: RadixNode, slot: int) -> None:
        """`node` can now be resumed from: `slot` holds the state after its page."""
        assert node.snapshot is None, "a node keeps one snapshot"
        node.snapshot = slot
        self.events.append(SnapshotStored(node.block_hash))

    def acquire(self, nodes: Sequence[RadixNode]) -> None:
        tick = next(self._clock)
        for node in nodes:
            if node.ref == 0:
                self.num_unreferenced -= 1
                if node.prev is not None:
                    _unlink(node)
            node.ref += 1
            node.last_used = tick
        self.visited += len(nodes)

    def release(self, nodes: Sequence[RadixNode]) -> None:
        tick = next(self._clock)
        head = self._queue
        for node in nodes:
            assert node.ref > 0, "released a page nobody holds"
            node.ref -= 1
            node.last_used = tick
            if node.ref == 0:
                self.num_unreferenced += 1
                if not node.children:  # queued last
                    last = head.prev
                    node.prev, node.next = last, head
                    last.next = head.prev = node
        self.visited += len(nodes)

    def acquire_window(self, node: RadixNode) -> None:
        """A sequence's window covers `node`'s window page (held: the node has one)."""
        assert node.window_page is not None, "no window page to hold"
        if node.window_ref == 0:
            self.num_window_unreferenced -= 1
            _unlink_window(node)
        node.window_ref += 1

    def release_window(self, node: RadixNode) -> None:
        """A sequence's window has left `node`'s window page (or the sequence ended)."""
        assert node.window_ref > 0, "released a window page nobody holds"
        node.window_ref -= 1
        if node.window_ref == 0:
            self.num_window_unreferenced += 1
            head = self._window_queue
            last = head.wprev
            node.wprev, node.wnext = last, head
            last.wnext = head.wprev = node

    def evict_windows(self, count: int) -> list[int]:
        """Free up to `count` unreferenced window pages, least recently released first,
        from any depth; their nodes stay (their full-attention pages are untouched)."""
        head, freed = self._window_queue, []
        while head.wnext is not head and len(freed) < count:
            node = head.wnext
            _unlink_window(node)
            self.visited += 1
            self.num_window_unreferenced -= 1
            freed.append(node.window_page)
            node.window_page = None
            self.events.append(WindowRemoved(node.block_hash))
        return freed

    def evict(self, count: int) -> list[int]:
        """Free up to `count` unreferenced pages, least recently released leaves first.

        A sequence holding a node holds its whole path, so every unreferenced node is
        reachable this way and `num_unreferenced` pages can always be freed.
        """
        head, freed = self._queue, []
        while head.next is not head and len(freed) < count:
            node = head.next
            _unlink(node)
            self.visited += 1
            parent = node.parent
            del parent.children[node.key]
            self.num_nodes -= 1
            self.num_unreferenced -= 1
            freed.append(node.page)
            self.events.append(BlockRemoved(node.block_hash))
            if node.snapshot is not None:
                self.snapshot_freed(node.snapshot)
                node.snapshot = None
            if node.window_page is not None:  # leaves with its node (unreferenced, queued)
                _unlink_window(node)
                self.num_window_unreferenced -= 1
                self.window_freed(node.window_page)
                node.window_page = None
            if parent.children:
                continue
            if parent.parent is None:
                if parent.salt:  # an emptied tenant namespace goes; the shared one stays
                    del self.roots[parent.salt]
            elif parent.ref == 0:
                # The parent is a leaf now. Used no later than the node just evicted (a
                # released chain): it goes next, so a chain leaves tail first. Used later:
                # it queues as if just released (approximate: it may be older than others).
                after = head if parent.last_used <= node.last_used else head.prev
                parent.prev, parent.next = after, after.next
                after.next.prev = parent
                after.next = parent
        return freed

    def take_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events

    def block_hashes(self) -> set[bytes]:
        """Hashes of every cached page (for checks against an index built from events;
        walks the whole tree, so never on the step path)."""
        return {node.block_hash for node in self._nodes()}

    def pages(self) -> set[int]:
        """Every cached page (for checks; walks the whole tree)."""
        return {node.page for node in self._nodes()}

    def window_pages(self) -> set[int]:
        """Every cached window page (for checks; walks the whole tree)."""
        return {node.window_page for node in self._nodes() if node.window_page is not None}

    def _nodes(self):
        stack = [node for root in self.roots.values() for node in root.children.values()]
        while stack:
            node = stack.pop()
            self.visited += 1
            yield node
            stack.extend(node.children.values())


def _unlink(node: RadixNode) -> None:
    """Take `node` out of the eviction queue."""
    before, after = node.prev, node.next
    before.next, after.prev = after, before
    node.prev = node.next = None


def _unlink_window(node: RadixNode) -> None:
    """Take `node` out of the window-page queue."""
    before, after = node.wprev, node.wnext
    before.wnext, after.wprev = after, before
    node.wprev = node.wnext = None
