"""Page allocation for sequences, with the radix prefix cache (when enabled) in front; for a
hybrid model also its linear layers' state slots and the cache's state snapshots; for a
model with sliding-window layers also their own pages (window_pages.py)."""

from __future__ import annotations

import logging
import time
from collections import deque

from iris.multimodal import PrefixResumeRule
from llm_svc.engine.host_tier import PAGE, STATE, WINDOW, LoadFailedError
from llm_svc.engine.radix_cache import DEVICE, RadixCache
from llm_svc.engine.sequence import Sequence
from llm_svc.engine.state_pool import StatePool
from llm_svc.engine.window_pages import WindowPages, pages_per_sequence

log = logging.getLogger(__name__)


class BlockManager:
    """Owns every KV page: free, private to one sequence, or cached in the radix tree.

    Paired checks and actions: `can_append` / `append` reserve pages for the next chunk;
    `match_prefix` / `release` share and give back cached pages; `commit` publishes the
    pages a step has filled to the cache. How much of a cached prefix a sequence resumes is
    `resume_rule`'s answer (default: every layer full attention), the one the gateway counts
    with too.

    Hybrid models (`states`, a StatePool; the rule has linear layers with a snapshot
    interval of k pages): a running sequence holds a state slot from its first `append` to
    its `release`. At every k-th page `commit` copies the sequence's state into a snapshot
    slot carried by that page's node; the rule resumes only from a node with a snapshot,
    and the slot starts as a copy of it (zeros without a hit). Chunks end at those
    boundaries (Scheduler), so the state at a boundary exists at the end of some step.

    Sliding-window layers (`windows`, a WindowPages): every check and action covers both
    pools; `commit` also gives back the window pages the next query no longer reads, and a
    hit needs the window pages of the last window before it (the rule's `windows`).
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        cache: RadixCache | None,
        resume_rule: PrefixResumeRule | None = None,
        states: StatePool | None = None,
        windows: WindowPages | None = None,
        full_layers: bool = True,
    ) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.cache = cache
        self.resume_rule = resume_rule or PrefixResumeRule(page_size)
        assert self.resume_rule.page_size == page_size, "the rule counts in this pod's pages"
        self.free_pages: deque[int] = deque(range(num_pages))
        self.states = states
        self.windows = windows
        # False: every layer slides, so the full pool's pages hold no KV; they only key the
        # radix tree (a node per page), and cost nothing.
        self.full_layers = full_layers
        self.snapshot_interval = self.resume_rule.snapshot_interval or 1
        self.store = None  # a StoreLink when the pods share a KV store (engine/store_link.py)
        self.num_snapshots_skipped = 0  # boundaries passed with every snapshot slot in use
        if cache is not None and states is not None:
            cache.snapshot_freed = states.give_snapshot

    @property
    def snapshot_tokens(self) -> int | None:
        """Hybrid models with a prefix cache: tokens between two snapshots (k pages)."""
        if self.states is None or self.cache is None:
            return None
        return self.snapshot_interval * self.page_size

    @property
    def num_available(self) -> int:
        """Pages obtainable now: free ones plus cached ones nobody references."""
        evictable = self.cache.num_unreferenced if self.cache else 0
        return len(self.free_pages) + evictable

    @property
    def num_used(self) -> int:
        """Pages some running sequence holds."""
        return self.num_pages - self.num_available

    @property
    def utilisation(self) -> float:
        """The fuller pool's share of pages in use, 0..1 (the full-attention pool alone
        when there is no window pool; a pool for no layers does not count)."""
        windows = self.windows
        full = self.num_used / self.num_pages if self.full_layers else 0.0
        if windows is None:
            return full
        return max(full, windows.num_used / (windows.num_pages - 1))

    def sequence_capacity(self, max_len: int) -> int:
        """Sequences of `max_len` tokens the pools hold at once, each decoding (a
        capacity figure: the tighter pool decides)."""
        counts = [self.num_pages // self.pages_for(max_len)] if self.full_layers else []
        windows = self.windows
        if windows is not None:
            per_seq = pages_per_sequence(max_len, windows.window, self.page_size)
            counts.append((windows.num_pages - 1) // per_seq)
        return min(counts)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def pages_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        target = self.pages_for(seq.num_computed_tokens + num_new_tokens)
        return max(0, target - len(seq.block_table))

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        if self.pages_needed(seq, num_new_tokens) > self.num_available:
            return False
        windows = self.windows
        if windows is None:
            return True
        target = self.pages_for(seq.num_computed_tokens + num_new_tokens)
        return windows.pages_needed(seq, target) <= windows.num_available

    def room(self, seq: Sequence) -> int:
        """Tokens `seq` can grow by now: what its pages and the obtainable ones cover,
        the tighter pool deciding (`can_append` holds for any count up to it)."""
        pages = len(seq.block_table) + self.num_available
        if self.windows is not None:
            pages = min(pages, len(seq.window_table) + self.windows.num_available)
        return max(0, pages * self.page_size - seq.num_computed_tokens)

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give `seq` the pages its next `num_new_tokens` tokens need (check first)."""
        needed = self.pages_needed(seq, num_new_tokens)
        if needed > len(self.free_pages):
            assert self.cache is not None, "not enough pages: call can_append first"
            self.free_pages.extend(self.cache.evict(needed - len(self.free_pages)))
        assert needed <= len(self.free_pages), "not enough pages: call can_append first"
        seq.block_table.extend(self.free_pages.popleft() for _ in range(needed))
        if self.windows is not None:
            self.windows.append(seq, len(seq.block_table))
        if self.states is not None and seq.state_slot is None:
            self._start_state(seq)

    def _start_state(self, seq: Sequence) -> None:
        """Give `seq` its state slot: the snapshot of its cached prefix, or zeros."""
        seq.state_slot = self.states.take_running()
        if seq.num_computed_tokens == 0:
            self.states.reset(seq.state_slot)
            return
        node = seq.tree_nodes[-1]
        assert node.snapshot is not None and seq.num_computed_tokens == (
            len(seq.tree_nodes) * self.page_size
        ), "a hybrid sequence resumes only from a snapshot"
        self.states.copy(node.snapshot, seq.state_slot)

    def drop_cached(self, announce: bool = True) -> int:
        """Free every cached page no sequence references (an admin's reset); returns how
        many. Without `announce` their REMOVED events are dropped too: the cache forgets
        them without telling its subscribers (a test hook: lost events)."""
        if self.cache is None:
            return 0
        mark = len(self.cache.events)
        freed = self.cache.evict(self.cache.num_unreferenced, spill=False)
        self.free_pages.extend(freed)
        if self.windows is not None:
            self.windows.free_pages.extend(
                self.cache.evict_windows(self.cache.num_window_unreferenced, spill=False)
            )
        host_freed = self.cache.drop_all_host() if self.cache.host is not None else 0
        if not announce:
            del self.cache.events[mark:]
        return len(freed) + host_freed

    def match_prefix(self, seq: Sequence) -> int:
        """Share the cached pages of `seq`'s longest cached prefix; returns tokens matched.

        At least one token is left to compute, since its logits give the next token. With
        the host tier, the part of the prefix held only in host memory is copied back
        first (`_load`), as far as the device pools have room; the rest is prefilled.
        """
        if self.cache is None or seq.block_table:
            return 0
        if self.store is not None and not seq.store_checked:
            seq.store_checked = True  # once: a waiting sequence is matched at every step
            most = self.resume_rule.resumable_blocks(seq.num_tokens, uncut_spans=seq.uncut_spans)
            interval = self.snapshot_interval if self.states is not None else None
            self.store.fetch_into(self.cache, seq, most, self.windows is not None, interval)
        nodes = self._resumable_nodes(seq)
        on_device = 0
        while on_device < len(nodes) and nodes[on_device].tier == DEVICE:
            on_device += 1
        self.cache.acquire(nodes[:on_device])
        started = time.perf_counter()
        if on_device < len(nodes):
            loaded = self._load(nodes[on_device:])
            self._cut(seq, nodes, on_device + loaded)
        host = self.cache.host
        if self.windows is not None and host is not None:
            self._load_windows(seq, nodes)
        if host is not None and not seq.tier_counted:
            # Once per sequence (a waiting one is matched again at every step).
            seq.tier_counted = True
            from_host = max(0, len(nodes) - on_device)
            most = self.resume_rule.resumable_blocks(seq.num_tokens, uncut_spans=seq.uncut_spans)
            lookups = host.stats.page_lookups
            lookups["device"] += len(nodes) - from_host
            lookups["host"] += from_host
            lookups["miss"] += max(0, most - len(nodes))
            host.stats.host_hit_tokens += from_host * self.page_size
            if from_host:
                seconds = time.perf_counter() - started
                host.stats.load_seconds.append(seconds)
                host.stats.load_rate.observe(from_host * host.unit_bytes(PAGE), seconds)
        seq.tree_nodes = nodes
        seq.block_table = [node.page for node in nodes]
        seq.num_computed_tokens = len(nodes) * self.page_size
        if self.windows is not None:
            self.windows.adopt(seq, nodes)
        return seq.num_computed_tokens

    def _cut(self, seq: Sequence, nodes: list, held: int) -> None:
        """Keep of `nodes` (the first `held` on the device and held by `seq`, the rest not
        loaded) the resume point the rule allows within the first `held`; release the
        rest of those."""
        del nodes[held:]  # not loaded: never held
        # Window pages may still be in host memory: `_load_windows` brings them next.
        keep = self._rule_blocks(seq, nodes, device_only=False)
        self.cache.release(nodes[keep:])
        del nodes[keep:]

    def _load(self, nodes: list) -> int:
        """Copy host `nodes` (a chain under device nodes `seq` holds) to the device, in
        order, each then held; returns how many. Stops where the device has no page (or
        snapshot slot) left, or at a failed copy, whose node and host-only descendants the
        cache drops."""
        cache, states = self.cache, self.states
        cache.pin(nodes)
        loaded = 0
        for node in nodes:
            page = self._device_page()
            if page is None:
                break
            slot = None
            if node.snapshot is not None:
                slot = self._snapshot_slot()
                if slot is None:
                    self.free_pages.append(page)
                    cache.host.stats.misses[STATE] += 1
                    break
            try:
                cache.load(node, page, slot)
            except LoadFailedError as err:
                log.warning("host tier: %s; the prefix from there is prefilled", err)
                self.free_pages.append(page)
                if slot is not None:
                    states.give_snapshot(slot)
                cache.drop_host(node)
                break
            loaded += 1
            cache.host.stats.hits[STATE] += slot is not None
        cache.unpin(nodes[loaded:])
        stats = cache.host.stats
        stats.hits[PAGE] += loaded
        stats.misses[PAGE] += len(nodes) - loaded
        return loaded

    def _device_page(self) -> int | None:
        if not self.free_pages:
            self.free_pages.extend(self.cache.evict(1))
        return self.free_pages.popleft() if self.free_pages else None

    def _snapshot_slot(self) -> int | None:
        """A device snapshot slot, evicting cached pages until one frees (None: none can)."""
        slot = self.states.take_snapshot()
        while slot is None and self.cache.num_unreferenced:
            self.free_pages.extend(self.cache.evict(1))
            slot = self.states.take_snapshot()
        return slot

    def _load_windows(self, seq: Sequence, nodes: list) -> None:
        """The window pages `seq`'s next query reads, copied back where only host memory
        holds them; where the window pool has no room (or a copy fails), the resume point
        moves back to one whose window pages are all on the device. The window pages
        already there are held meanwhile, so making room never takes one of them."""
        cache, stats = self.cache, self.cache.host.stats
        reading = nodes[self.windows.first_block(len(nodes) * self.page_size) :]
        held = [node for node in reading if node.window_page is not None]
        for node in held:
            cache.acquire_window(node)
        complete = True
        for node in reading:
            if node.window_page is not None:
                continue
            page = None
            if node.host_window is not None:
                cache.pin_window(node)
                page = self._window_page()
            if page is None:
                cache.unpin_window(node)
                stats.misses[WINDOW] += node.host_window is not None
                complete = False
                break
            try:
                cache.load_window(node, page)
            except LoadFailedError as err:
                log.warning("host tier: %s; that window is prefilled", err)
                self.windows.free_pages.append(page)
                cache.drop_host_window(node)
                complete = False
                break
            cache.acquire_window(node)
            held.append(node)
            stats.hits[WINDOW] += 1
        for node in held:
            cache.release_window(node)
        if not complete:
            keep = self._rule_blocks(seq, nodes, device_only=True)
            cache.release(nodes[keep:])
            del nodes[keep:]

    def _window_page(self) -> int | None:
        free = self.windows.free_pages
        if not free:
            free.extend(self.cache.evict_windows(1))
        return free.popleft() if free else None

    def _resumable_nodes(self, seq: Sequence) -> list:
        """The cached nodes `seq` resumes from: the held prefix (in either tier), cut where
        the shared rule says (iris.multimodal.PrefixResumeRule, which the gateway counts
        with too). The walk stops at the most the rule could allow, so a long prompt is not
        walked past it. For a hybrid model the rule also asks which depths keep a state
        snapshot, for a model with sliding layers which blocks keep their window page."""
        rule = self.resume_rule
        most = rule.resumable_blocks(seq.num_tokens, uncut_spans=seq.uncut_spans)
        held = self.cache.match(seq.token_ids[: most * self.page_size], seq.cache_salt)
        return held[: self._rule_blocks(seq, held, device_only=False)]

    def _rule_blocks(self, seq: Sequence, held: list, device_only: bool) -> int:
        """The rule's resume depth over `held` nodes: windows and snapshots in either tier,
        or (`device_only`) on the device alone."""
        windows = None
        if self.windows is not None:
            if device_only:
                windows = lambda index: held[index].window_page is not None  # noqa: E731
            else:
                windows = lambda index: (  # noqa: E731
                    held[index].window_page is not None or held[index].host_window is not None
                )
        return self.resume_rule.resumable_blocks(
            seq.num_tokens,
            held_blocks=len(held),
            uncut_spans=seq.uncut_spans,
            snapshots=lambda depth: held[depth - 1].snapshot is not None,
            windows=windows,
        )

    def peek_prefix(self, seq: Sequence) -> int:
        """Tokens of `seq` the prefix cache holds, without taking them: a load estimate
        (they may be evicted before `seq` is admitted). Looked up once per sequence, since
        the engine asks after every step and a long prompt's walk is not free."""
        if seq.block_table:
            return seq.num_computed_tokens
        if self.cache is None:
            return 0
        if seq.peeked_prefix_tokens is None:
            seq.peeked_prefix_tokens = len(self._resumable_nodes(seq)) * self.page_size
        return seq.peeked_prefix_tokens

    def commit(self, seq: Sequence) -> None:
        """Publish `seq`'s pages whose KV is now complete to the prefix cache.

        If another sequence cached the same prefix meanwhile, `seq` switches to the cached
        page (same tokens at the same positions) and its copy is freed; so for the window
        page, if that node still has one (else `seq`'s stays private). Then the window
        pages `seq`'s next query does not read go back (WindowPages.slide).
        """
        if self.cache is not None:
            self._publish(seq)
            if self.snapshot_tokens is not None:
                self._snapshot(seq)
        if self.windows is not None:
            self.windows.slide(seq)

    def _publish(self, seq: Sequence) -> None:
        size, windows = self.page_size, self.windows
        for index in range(len(seq.tree_nodes), seq.num_computed_tokens // size):
            parent = seq.tree_nodes[-1] if seq.tree_nodes else None
            tokens = seq.token_ids[index * size : (index + 1) * size]
            window_page = None
            if windows is not None and index >= seq.window_start:
                window_page = seq.window_table[index]
            node, created = self.cache.insert(
                parent, tokens, seq.block_table[index], seq.cache_salt, window_page
            )
            if created and self.store is not None:
                self.store.published(node, PAGE, node.page, seq.cache_salt)
                if window_page is not None and node.window_page == window_page:
                    self.store.published(node, WINDOW, window_page, seq.cache_salt)
            if not created:
                self.cache.acquire([node])
                self.free_pages.append(seq.block_table[index])
                seq.block_table[index] = node.page
                if window_page is not None and node.window_page is not None:
                    self.cache.acquire_window(node)
                    windows.free_pages.append(window_page)
                    seq.window_table[index] = node.window_page
            seq.tree_nodes.append(node)

    def _snapshot(self, seq: Sequence) -> None:
        """At a boundary (k pages), keep `seq`'s state on that page's node, unless the node
        has one already. With every slot taken, unreferenced cached pages are evicted until
        one frees; if none can be (all held by running sequences), the node is no hit and
        `num_snapshots_skipped` counts it."""
        depth = len(seq.tree_nodes)
        at_boundary = seq.num_computed_tokens == depth * self.page_size
        if not (depth and at_boundary and depth % self.snapshot_interval == 0):
            return
        node = seq.tree_nodes[-1]
        if node.snapshot is not None:
            return
        slot = self.states.take_snapshot()
        while slot is None and self.cache.num_unreferenced:
            # Every slot is taken: cached pages go, least recently released first, until one
            # with a snapshot has (each eviction is a KV event, so the gateway follows).
            self.free_pages.extend(self.cache.evict(1))
            slot = self.states.take_snapshot()
        if slot is None:  # every snapshot is on a prefix some running sequence holds
            self.num_snapshots_skipped += 1
            return
        self.states.copy(seq.state_slot, slot)
        self.cache.attach_snapshot(node, slot)
        if self.store is not None:
            self.store.published(node, STATE, slot, seq.cache_salt)

    def trim(self, seq: Sequence) -> None:
        """Give back `seq`'s pages past its computed tokens: those a verification step took
        for drafts it rejected (private pages: only computed pages are ever published)."""
        keep = max(self.pages_for(seq.num_computed_tokens), len(seq.tree_nodes))
        self.free_pages.extend(seq.block_table[keep:])
        del seq.block_table[keep:]
        if self.windows is not None:
            self.windows.trim(seq, keep)

    def release(self, seq: Sequence) -> None:
        """Give back every page of `seq` (cached ones stay cached, unreferenced)."""
        if self.windows is not None:
            self.windows.release(seq)
        if self.cache is not None:
            self.cache.release(seq.tree_nodes)
        self.free_pages.extend(seq.block_table[len(seq.tree_nodes) :])
        seq.block_table = []
        seq.tree_nodes = []
        if seq.state_slot is not None:
            self.states.give_running(seq.state_slot)
            seq.state_slot = None
