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

Host tier (`host`, llm_svc/engine/host_tier.py; None: off). A node is on the device
(`tier` DEVICE: `page` is a device page) or only in host memory (HOST: `page` is a host
slot); its snapshot is always where its page is (a unit with it), its window page on the
device (`window_page`) or in host memory (`host_window`). `evict` then saves a leaving page
(its window page and snapshot with it) to the host tier and keeps its node, marked HOST;
the host tier makes room by dropping its least recently used units: a host-only node
without children (it leaves the tree: BlockRemoved), or the host copy of a window page
whose node stayed on the device (WindowRemoved). A node leaves the tree only when it
leaves its last tier; one the host tier has no room for leaves at once, with its host-only
descendants. A device node's parent is on the device, so the host-only nodes under a
device node form subtrees, and the device queue holds nodes without *device* children.
`load` brings a host node back (the block manager decides which, llm_svc/engine/
block_manager.py). A page still held is still held: its BlockStored stands, and a hit from
either tier counts as cached. Its moves are announced besides (HostStored when it goes to
host memory, HostRemoved when it is on the device again), so the gateway knows what a hit
there costs (docs/design/gateway.md, "Where a prefix lives").

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
from collections import OrderedDict
from collections.abc import Callable, Sequence

from iris.multimodal import next_block_hash, root_hash
from llm_svc.engine.host_tier import PAGE, STATE, WINDOW, HostTier
from llm_svc.engine.kv_events import (
    BlockRemoved,
    BlockStored,
    HostRemoved,
    HostStored,
    KVEvent,
    SnapshotStored,
    WindowRemoved,
)

DEVICE, HOST = 0, 1


class RadixNode:
    __slots__ = (
        "key", "page", "block_hash", "parent", "children", "ref", "last_used", "salt",
        "prev", "next", "snapshot", "window_page", "window_ref", "wprev", "wnext", "tier",
        "device_children", "host_window", "pinned",
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
        self.tier = DEVICE  # HOST: `page` and `snapshot` are host slots
        self.device_children = 0
        self.host_window: int | None = None  # its window page's host slot
        self.pinned = False  # being loaded: the host tier may not drop it


class RadixCache:
    """Pages shared by prefix. `match` / `insert` / `acquire` / `release` / `evict`."""

    def __init__(
        self,
        page_size: int,
        fingerprint: bytes,
        snapshot_freed: Callable[[int], None] | None = None,
        window_freed: Callable[[int], None] | None = None,
        host: HostTier | None = None,
    ) -> None:
        self.page_size = page_size
        self.host = host
        # The host tier's units it may drop, least recently used first: host-only nodes
        # without children, and host copies of window pages whose node is on the device.
        self._host_nodes: OrderedDict[RadixNode, None] = OrderedDict()
        self._host_windows: OrderedDict[RadixNode, None] = OrderedDict()
        self.num_host_nodes = 0
        # Called as (kind, device index) when a device unit leaves the tree or the device
        # (HostTier.left: a store write queued for it is then void).
        self.left: Callable[[str, int], None] = lambda kind, index: None
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
        if existing is not None and existing.tier == DEVICE:
            return existing, False
        if existing is not None:
            # Held only in host memory: the caller's freshly computed page becomes its
            # device copy (no copy needed), announced already.
            self._adopt_computed(existing, page, window_page)
            return existing, True
        node = RadixNode(key, page, next_block_hash(parent.block_hash, key), parent)
        node.ref, node.last_used = 1, next(self._clock)
        if window_page is not None:
            node.window_page, node.window_ref = window_page, 1
        self._device_child_added(parent)
        parent.children[key] = node
        self.num_nodes += 1
        self.events.append(BlockStored(node.block_hash, parent.block_hash, key))
        return node, True

    def _device_child_added(self, parent: RadixNode) -> None:
        parent.device_children += 1
        if parent.prev is not None:
            _unlink(parent)  # no longer a leaf of the device tree

    def _adopt_computed(self, node: RadixNode, page: int, window_page: int | None) -> None:
        """A host-only `node` takes a device `page` a sequence computed (referenced once):
        its host copy goes; so does its host snapshot (the sequence snapshots its own
        state at that boundary) and, if the sequence brings a window page, its host one."""
        self._unqueue_host(node)
        host = self.host
        host.give(PAGE, node.page)
        if node.snapshot is not None:
            host.give(STATE, node.snapshot)
            node.snapshot = None
        if window_page is not None:
            if node.host_window is not None:
                host.give(WINDOW, node.host_window)
                node.host_window = None
            node.window_page, node.window_ref = window_page, 1
        elif node.host_window is not None:
            self._host_windows[node] = None  # its window page stays in host memory
        node.tier, node.page = DEVICE, page
        node.ref, node.last_used = 1, next(self._clock)
        self.num_host_nodes -= 1
        self._device_child_added(node.parent)
        self.events.append(HostRemoved(node.block_hash))

    def attach_snapshot(self, node: RadixNode, slot: int) -> None:
        """`node` can now be resumed from: `slot` holds the state after its page."""
        assert node.snapshot is None, "a node keeps one snapshot"
        node.snapshot = slot
        self.events.append(SnapshotStored(node.block_hash))

    def acquire(self, nodes: Sequence[RadixNode]) -> None:
        tick = next(self._clock)
        for node in nodes:
            assert node.tier == DEVICE, "only device pages are held by sequences"
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
                if not node.device_children:  # queued last
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

    def evict_windows(self, count: int, spill: bool = True) -> list[int]:
        """Free up to `count` unreferenced window pages, least recently released first,
        from any depth; their nodes stay (their full-attention pages are untouched). With
        the host tier, each is saved there first when it has room (no event: still held)."""
        head, freed = self._window_queue, []
        while head.wnext is not head and len(freed) < count:
            node = head.wnext
            _unlink_window(node)
            self.visited += 1
            self.num_window_unreferenced -= 1
            freed.append(node.window_page)
            self.left(WINDOW, node.window_page)
            slot = self._host_slot(WINDOW) if spill and self.host is not None else None
            if slot is not None:
                self.host.save(WINDOW, node.window_page, slot)
                node.host_window = slot
                self._host_windows[node] = None
            else:
                self.events.append(WindowRemoved(node.block_hash))
            node.window_page = None
        return freed

    def evict(self, count: int, spill: bool = True) -> list[int]:
        """Free up to `count` unreferenced device pages, least recently released leaves of
        the device tree first. With the host tier (and `spill`), each is saved there with
        its window page and snapshot and its node stays, HOST; without room (or tier) the
        node leaves the tree with its host-only descendants.

        A sequence holding a node holds its whole path, so every unreferenced node is
        reachable this way and `num_unreferenced` pages can always be freed.
        """
        head, freed = self._queue, []
        while head.next is not head and len(freed) < count:
            node = head.next
            _unlink(node)
            self.visited += 1
            self.num_unreferenced -= 1
            freed.append(node.page)
            self.left(PAGE, node.page)
            parent = node.parent
            parent.device_children -= 1
            if not (spill and self.host is not None and self._spill(node)):
                self._remove_device_node(node)
            if parent.device_children or parent.parent is None or parent.ref:
                if parent.parent is None and not parent.children and parent.salt:
                    self.roots.pop(parent.salt, None)  # an emptied tenant namespace goes
                continue
            # The parent is a leaf of the device tree now. Used no later than the node just
            # evicted (a released chain): it goes next, so a chain leaves tail first. Used
            # later: it queues as if just released (approximate: it may be older).
            after = head if parent.last_used <= node.last_used else head.prev
            parent.prev, parent.next = after, after.next
            after.next.prev = parent
            after.next = parent
        return freed

    def _remove_device_node(self, node: RadixNode) -> None:
        """`node` (device page already taken) leaves the tree, with its host-only subtree."""
        for child in list(node.children.values()):
            self._drop_host_subtree(child)
        del node.parent.children[node.key]
        self.num_nodes -= 1
        self.events.append(BlockRemoved(node.block_hash))
        if node.snapshot is not None:
            self.left(STATE, node.snapshot)
            self.snapshot_freed(node.snapshot)
            node.snapshot = None
        if node.window_page is not None:  # leaves with its node (unreferenced, queued)
            _unlink_window(node)
            self.num_window_unreferenced -= 1
            self.left(WINDOW, node.window_page)
            self.window_freed(node.window_page)
            node.window_page = None
        self._drop_host_window(node, announce=False)

    # --- the host tier ---------------------------------------------------------------
    def _spill(self, node: RadixNode) -> bool:
        """Save device `node`'s unit to the host tier and mark it HOST; False (nothing
        changed) when the tier has no room for its page or snapshot. A window page the
        tier has no room for is dropped (WindowRemoved), the node still goes."""
        host = self.host
        page_slot = self._host_slot(PAGE)
        if page_slot is None:
            host.stats.dropped_full += 1
            return False
        state_slot = None
        if node.snapshot is not None:
            state_slot = self._host_slot(STATE)
            if state_slot is None:
                host.give(PAGE, page_slot)
                host.stats.dropped_full += 1
                return False
        host.save(PAGE, node.page, page_slot)
        if state_slot is not None:
            host.save(STATE, node.snapshot, state_slot)
            self.left(STATE, node.snapshot)
            self.snapshot_freed(node.snapshot)
            node.snapshot = state_slot
        if node.window_page is not None:
            _unlink_window(node)
            self.num_window_unreferenced -= 1
            self.left(WINDOW, node.window_page)
            window_slot = self._host_slot(WINDOW)
            if window_slot is not None:
                host.save(WINDOW, node.window_page, window_slot)
                node.host_window = window_slot
            else:
                self.events.append(WindowRemoved(node.block_hash))
            self.window_freed(node.window_page)
            node.window_page = None
        elif node.host_window is not None:
            del self._host_windows[node]  # now part of a host node's unit
        node.tier, node.page = HOST, page_slot
        self.num_host_nodes += 1
        if not node.children:
            self._host_nodes[node] = None
        self.events.append(HostStored(node.block_hash))
        return True

    def _host_slot(self, kind: str) -> int | None:
        """A free host slot of `kind`, dropping the tier's least recently used units until
        one frees; None when none can be (the tier is full of units being loaded, or of
        nodes with children)."""
        host = self.host
        if not host.has(kind):
            return None
        while (slot := host.take(kind)) is None:
            if kind == WINDOW and self._host_windows:
                node, _ = self._host_windows.popitem(last=False)
                self._drop_host_window(node, announce=True, queued=False)
            elif self._host_nodes:
                node, _ = self._host_nodes.popitem(last=False)
                self._drop_host_node(node)
            else:
                return None
        return slot

    def _drop_host_window(self, node: RadixNode, announce: bool, queued: bool = True) -> None:
        if node.host_window is None:
            return
        self.host.give(WINDOW, node.host_window)
        node.host_window = None
        if queued and node.tier == DEVICE:
            self._host_windows.pop(node, None)
        if announce:
            self.events.append(WindowRemoved(node.block_hash))

    def _drop_host_node(self, node: RadixNode) -> None:
        """Host-only `node`, childless (out of the queue already), leaves the tree."""
        self.visited += 1
        host = self.host
        host.give(PAGE, node.page)
        if node.snapshot is not None:
            host.give(STATE, node.snapshot)
            node.snapshot = None
        if node.host_window is not None:
            host.give(WINDOW, node.host_window)
            node.host_window = None
        parent = node.parent
        del parent.children[node.key]
        self.num_nodes -= 1
        self.num_host_nodes -= 1
        self.events.append(BlockRemoved(node.block_hash))
        if parent.children:
            return
        if parent.parent is None:
            if parent.salt:
                self.roots.pop(parent.salt, None)
        elif parent.tier == HOST and not parent.pinned:
            # Childless now: it may go. Used no later than its child: it goes next.
            self._host_nodes[parent] = None
            if parent.last_used <= node.last_used:
                self._host_nodes.move_to_end(parent, last=False)

    def _drop_host_subtree(self, node: RadixNode) -> None:
        """Host-only `node` and every node under it (all host-only) leave the tree."""
        for child in list(node.children.values()):
            self._drop_host_subtree(child)
        self._unqueue_host(node)
        node.pinned = False
        self._drop_host_node(node)

    def _unqueue_host(self, node: RadixNode) -> None:
        self._host_nodes.pop(node, None)

    def insert_host(
        self, parent: RadixNode, tokens: Sequence[int], salt: bytes, units: dict
    ) -> RadixNode | None:
        """A host-only node under `parent` from the KV store's `units` (kind -> payload or
        None; the page's is required), pinned (`unpin` when done), announced as stored.
        None when the host tier has no room for its page or a payload has the wrong size
        (a snapshot or window page without room is left out: the rule then resumes
        before it)."""
        key = tuple(tokens)
        if key in parent.children:
            return None
        if parent.tier == HOST:
            self._unqueue_host(parent)  # it is getting a child
        host, slots = self.host, {}
        for kind in (PAGE, STATE, WINDOW):
            payload = units.get(kind)
            if payload is None or not host.has(kind):
                continue
            slot = self._host_slot(kind)
            if slot is not None and not host.fill_slot(kind, slot, payload):
                host.give(kind, slot)
                slot = None
            if slot is None and kind == PAGE:
                break
            if slot is not None:
                slots[kind] = slot
        if PAGE not in slots:
            for kind, slot in slots.items():
                host.give(kind, slot)
            if parent.tier == HOST and not parent.children and not parent.pinned:
                self._host_nodes[parent] = None
            return None
        node = RadixNode(key, slots[PAGE], next_block_hash(parent.block_hash, key), parent)
        node.tier, node.pinned, node.last_used = HOST, True, next(self._clock)
        node.snapshot, node.host_window = slots.get(STATE), slots.get(WINDOW)
        parent.children[key] = node
        self.num_nodes += 1
        self.num_host_nodes += 1
        self.events.append(BlockStored(node.block_hash, parent.block_hash, key))
        self.events.append(HostStored(node.block_hash))
        if node.snapshot is not None:
            self.events.append(SnapshotStored(node.block_hash))
        if host.has(WINDOW) and node.host_window is None:
            self.events.append(WindowRemoved(node.block_hash))
        return node

    def pin(self, nodes: Sequence[RadixNode]) -> None:
        """Host nodes about to be loaded: the tier may not drop them meanwhile."""
        for node in nodes:
            node.pinned = True
            self._unqueue_host(node)

    def unpin(self, nodes: Sequence[RadixNode]) -> None:
        """Nodes `pin`ned and not loaded (still in the tree, host-only) may go again."""
        for node in nodes:
            node.pinned = False
            in_tree = node.parent.children.get(node.key) is node
            if in_tree and node.tier == HOST and not node.children:
                self._host_nodes[node] = None

    def load(self, node: RadixNode, page: int, state_slot: int | None) -> None:
        """Copy pinned host `node` to device `page` (its snapshot to device `state_slot`,
        which it must be given when it has one) and mark it DEVICE, referenced once. Its
        window page stays in host memory (`load_window`). LoadFailedError leaves it
        as it was (the caller drops it)."""
        assert node.tier == HOST and node.pinned, "load a pinned host node"
        assert (node.snapshot is None) == (state_slot is None), "a snapshot moves with its page"
        host = self.host
        host.load(PAGE, node.page, page)
        if state_slot is not None:
            host.load(STATE, node.snapshot, state_slot)
            host.give(STATE, node.snapshot)
            node.snapshot = state_slot
        host.give(PAGE, node.page)
        node.tier, node.page, node.pinned = DEVICE, page, False
        if node.host_window is not None:
            self._host_windows[node] = None
        node.ref, node.last_used = 1, next(self._clock)
        self.num_host_nodes -= 1
        self._device_child_added(node.parent)
        self.events.append(HostRemoved(node.block_hash))

    def pin_window(self, node: RadixNode) -> None:
        """Device `node`'s host window page is about to be loaded: not dropped meanwhile."""
        self._host_windows.pop(node, None)

    def unpin_window(self, node: RadixNode) -> None:
        """`pin_window`'s node, not loaded: its host window page may go again."""
        if node.host_window is not None and node.tier == DEVICE:
            self._host_windows[node] = None

    def load_window(self, node: RadixNode, window_page: int) -> None:
        """Copy device `node`'s host window page into `window_page`, unreferenced (queued
        as a released one). LoadFailedError leaves it as it was."""
        assert node.tier == DEVICE and node.host_window is not None
        self.host.load(WINDOW, node.host_window, window_page)
        self._drop_host_window(node, announce=False)
        node.window_page = window_page
        self.num_window_unreferenced += 1
        head = self._window_queue
        last = head.wprev
        node.wprev, node.wnext = last, head
        last.wnext = head.wprev = node

    def drop_host(self, node: RadixNode) -> None:
        """A host node whose load failed: it and its host-only descendants leave the tree
        (their tokens are prefilled; a unit whose copy failed is never served)."""
        self._drop_host_subtree(node)

    def drop_host_window(self, node: RadixNode) -> None:
        """Device `node`'s host window page whose load failed: gone (WindowRemoved)."""
        self._drop_host_window(node, announce=True)

    def drop_all_host(self) -> int:
        """Every unit of the host tier goes (an admin's reset); returns the pages freed."""
        freed = 0
        while self._host_nodes:
            node, _ = self._host_nodes.popitem(last=False)
            self._drop_host_node(node)
            freed += 1
        while self._host_windows:
            node, _ = self._host_windows.popitem(last=False)
            self._drop_host_window(node, announce=True, queued=False)
        return freed

    def take_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events

    def block_hashes(self) -> set[bytes]:
        """Hashes of every cached page (for checks against an index built from events;
        walks the whole tree, so never on the step path)."""
        return {node.block_hash for node in self._nodes()}

    def pages(self) -> set[int]:
        """Every cached device page (for checks; walks the whole tree)."""
        return {node.page for node in self._nodes() if node.tier == DEVICE}

    def host_block_hashes(self) -> set[bytes]:
        """Hashes of the cached pages held in host memory only (for checks; walks the
        whole tree)."""
        return {node.block_hash for node in self._nodes() if node.tier == HOST}

    def host_units(self) -> dict[str, set[int]]:
        """Every host slot held, by kind (for checks; walks the whole tree)."""
        units = {PAGE: set(), WINDOW: set(), STATE: set()}
        for node in self._nodes():
            if node.tier == HOST:
                units[PAGE].add(node.page)
                if node.snapshot is not None:
                    units[STATE].add(node.snapshot)
            if node.host_window is not None:
                units[WINDOW].add(node.host_window)
        return units

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
