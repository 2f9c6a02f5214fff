"""Page allocation for sequences, with the radix prefix cache (when enabled) in front."""

from __future__ import annotations

from collections import deque

from iris.multimodal import PrefixResumeRule
from llm_svc.engine.radix_cache import RadixCache
from llm_svc.engine.sequence import Sequence


class BlockManager:
    """Owns every KV page: free, private to one sequence, or cached in the radix tree.

    Paired checks and actions: `can_append` / `append` reserve pages for the next chunk;
    `match_prefix` / `release` share and give back cached pages; `commit` publishes the
    pages a step has filled to the cache. How much of a cached prefix a sequence resumes is
    `resume_rule`'s answer (default: every layer full attention), the one the gateway counts
    with too.
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        cache: RadixCache | None,
        resume_rule: PrefixResumeRule | None = None,
    ) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.cache = cache
        self.resume_rule = resume_rule or PrefixResumeRule(page_size)
        assert self.resume_rule.page_size == page_size, "the rule counts in this pod's pages"
        self.free_pages: deque[int] = deque(range(num_pages))

    @property
    def num_available(self) -> int:
        """Pages obtainable now: free ones plus cached ones nobody references."""
        evictable = self.cache.num_unreferenced if self.cache else 0
        return len(self.free_pages) + evictable

    @property
    def num_used(self) -> int:
        """Pages some running sequence holds."""
        return self.num_pages - self.num_available

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def pages_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        target = self.pages_for(seq.num_computed_tokens + num_new_tokens)
        return max(0, target - len(seq.block_table))

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.pages_needed(seq, num_new_tokens) <= self.num_available

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give `seq` the pages its next `num_new_tokens` tokens need (check first)."""
        needed = self.pages_needed(seq, num_new_tokens)
        if needed > len(self.free_pages):
            assert self.cache is not None, "not enough pages: call can_append first"
            self.free_pages.extend(self.cache.evict(needed - len(self.free_pages)))
        assert needed <= len(self.free_pages), "not enough pages: call can_append first"
        seq.block_table.extend(self.free_pages.popleft() for _ in range(needed))

    def match_prefix(self, seq: Sequence) -> int:
        """Share the cached pages of `seq`'s longest cached prefix; returns tokens matched.

        At least one token is left to compute, since its logits give the next token.
        """
        if self.cache is None or seq.block_table:
            return 0
        nodes = self._resumable_nodes(seq)
        self.cache.acquire(nodes)
        seq.tree_nodes = nodes
        seq.block_table = [node.page for node in nodes]
        seq.num_computed_tokens = len(nodes) * self.page_size
        return seq.num_computed_tokens

    def _resumable_nodes(self, seq: Sequence) -> list:
        """The cached nodes `seq` resumes from: the held prefix, cut where the shared rule
        says (iris.multimodal.PrefixResumeRule, which the gateway counts with too). The
        walk stops at the most the rule could allow, so a long prompt is not walked past it."""
        rule = self.resume_rule
        spans = seq.uncut_spans
        most = rule.resumable_blocks(seq.num_tokens, uncut_spans=spans)
        held = self.cache.match(seq.token_ids[: most * self.page_size], seq.cache_salt)
        return held[: rule.resumable_blocks(seq.num_tokens, len(held), spans)]

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
        page (same tokens at the same positions) and its copy is freed.
        """
        if self.cache is None:
            return
        size = self.page_size
        for index in range(len(seq.tree_nodes), seq.num_computed_tokens // size):
            parent = seq.tree_nodes[-1] if seq.tree_nodes else None
            tokens = seq.token_ids[index * size : (index + 1) * size]
            node, created = self.cache.insert(
                parent, tokens, seq.block_table[index], seq.cache_salt
            )
            if not created:
                self.cache.acquire([node])
                self.free_pages.append(seq.block_table[index])
                seq.block_table[index] = node.page
            seq.tree_nodes.append(node)

    def release(self, seq: Sequence) -> None:
        """Give back every page of `seq` (cached ones stay cached, unreferenced)."""
        if self.cache is not None:
            self.cache.release(seq.tree_nodes)
        self.free_pages.extend(seq.block_table[len(seq.tree_nodes) :])
        seq.block_table = []
        seq.tree_nodes = []
