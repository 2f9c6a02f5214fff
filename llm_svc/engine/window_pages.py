"""The sliding-window layers' own KV pages (docs/design/engine.md).

A model with sliding layers (window W) keeps their KV in a pool of its own, same page size
as the full-attention layers' pool. A sequence's `window_table` maps its positions to pages
of this pool exactly as `block_table` does for the full layers, but a page whose every
position is out of the window of the next query (before `window_first_block`) goes back:
to the free list if private, to the radix cache's window queue (still cached, evictable)
if a cached node carries it. Its table entry then holds page 0, the pool's null page,
which nobody writes and every read masks out, so indices stay aligned with `block_table`
and the attention backends read the table as they read any other. A running sequence
therefore holds at most the pages of W − 1 + its chunk's tokens, plus one for alignment.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from iris.multimodal import window_first_block
from llm_svc.engine.radix_cache import RadixCache, RadixNode
from llm_svc.engine.sequence import Sequence

NULL_PAGE = 0  # never allocated: freed positions point here


def pages_per_sequence(max_len: int, window: int, page_size: int) -> int:
    """Window pages one decoding sequence of up to `max_len` tokens holds at most: those
    of its last W - 1 keys and the new token, which may straddle one more page."""
    return min(-(-max_len // page_size), (window - 1) // page_size + 2)


@dataclass(frozen=True)
class WindowNeed:
    """What one sequence needs of the window pool to run alone (docs/design/engine.md "Pages
    per layer kind", rule (a)): the pool is sized, and each request checked, by it."""

    window: int
    page_size: int
    chunk_tokens: int  # one step's chunk: max_num_batched_tokens

    def pages(self, length: int) -> int:
        """Window pages, the null page among them, that let one sequence of up to `length`
        tokens run alone: a decode's window and one step's chunk beside it, and never more
        than all its own pages."""
        own = -(-length // self.page_size)
        chunk = -(-self.chunk_tokens // self.page_size)
        return min(own, pages_per_sequence(length, self.window, self.page_size) + chunk) + 1


class WindowPages:
    """Paired actions as the block manager's: `pages_needed` / `append`; `slide` gives back
    what left the window; `adopt` takes a cached prefix's trailing window; `release`."""

    def __init__(self, num_pages: int, page_size: int, window: int, cache: RadixCache | None):
        assert num_pages >= 2, "the window pool needs its null page and one more"
        self.num_pages = num_pages
        self.page_size = page_size
        self.window = window
        self.cache = cache
        self.free_pages: deque[int] = deque(range(1, num_pages))
        self.peak_held = 0  # the most pages one sequence has held at once (a diagnostic)
        if cache is not None:
            cache.window_freed = self.free_pages.append

    @property
    def num_available(self) -> int:
        """Pages obtainable now: free ones plus cached ones no window covers."""
        evictable = self.cache.num_window_unreferenced if self.cache else 0
        return len(self.free_pages) + evictable

    @property
    def num_used(self) -> int:
        """Pages some running sequence holds (the null page is nobody's)."""
        return self.num_pages - 1 - self.num_available

    def first_block(self, position: int) -> int:
        """The first page a query at `position` reads."""
        return window_first_block(position, self.window, self.page_size)

    def pages_needed(self, seq: Sequence, target: int) -> int:
        """Pages `seq` lacks to cover `target` pages of positions."""
        return max(0, target - len(seq.window_table))

    def append(self, seq: Sequence, target: int) -> None:
        needed = self.pages_needed(seq, target)
        if needed > len(self.free_pages):
            assert self.cache is not None, "not enough window pages: call can_append first"
            self.free_pages.extend(self.cache.evict_windows(needed - len(self.free_pages)))
        assert needed <= len(self.free_pages), "not enough window pages: call can_append first"
        seq.window_table.extend(self.free_pages.popleft() for _ in range(needed))
        self.peak_held = max(self.peak_held, self.held(seq))

    def adopt(self, seq: Sequence, nodes: list[RadixNode]) -> None:
        """`seq` resumes after `nodes`: it takes the window pages its next query reads
        (the rule made sure they are held) and null entries before them."""
        first = self.first_block(len(nodes) * self.page_size)
        for node in nodes[first:]:
            self.cache.acquire_window(node)
        seq.window_table = [NULL_PAGE] * first + [node.window_page for node in nodes[first:]]
        seq.window_start = first

    def slide(self, seq: Sequence) -> None:
        """Give back the pages before the window of `seq`'s next query."""
        self._give_back(seq, self.first_block(seq.num_computed_tokens))

    def trim(self, seq: Sequence, keep: int) -> None:
        """Give back the (private) pages of `seq`'s table past its first `keep`."""
        self.free_pages.extend(page for page in seq.window_table[keep:] if page != NULL_PAGE)
        del seq.window_table[keep:]

    def release(self, seq: Sequence) -> None:
        self._give_back(seq, len(seq.window_table))
        seq.window_table = []
        seq.window_start = 0

    def _give_back(self, seq: Sequence, end: int) -> None:
        table, nodes = seq.window_table, seq.tree_nodes
        for index in range(seq.window_start, min(end, len(table))):
            page = table[index]
            if index < len(nodes) and nodes[index].window_page == page:
                self.cache.release_window(nodes[index])
            else:
                self.free_pages.append(page)
            table[index] = NULL_PAGE
        seq.window_start = max(seq.window_start, end)

    def held(self, seq: Sequence) -> int:
        """Window pages `seq` holds now (what the bench and tests count)."""
        return len(seq.window_table) - seq.window_start
