"""Continuous batching with chunked prefill under a per-step token budget.

Each step: running sequences in decode go first (one token each), then running sequences
part-way through their prefill, then waiting sequences in arrival order — each takes
min(its remaining tokens, budget left), grown to the end of an image span it would end
inside when the model attends both ways within one (Gemma 3: a step may exceed the budget
by at most one span; the engine refuses a budget smaller than one span at load). Prefill
chunks and decodes share one step. When a sequence needs a page and none is left, the most
recently admitted running sequence is preempted: its pages are released (full ones stay in
the prefix cache) and it waits at the head of the queue to be prefilled again, prompt and
output so far. A sequence that is itself the newest left takes the largest chunk the pages
hold instead, and the queue's head, when nothing runs, is admitted with such a chunk: since
every request admitted fits alone (validation.check_request), nothing waits forever.

Images: at admission a sequence first shares its cached prefix (those pages stay locked by
their reference count); the items with tokens past that prefix whose embeddings it does not
hold yet are fetched by the `EmbeddingFetcher` on its threads while the sequence waits in
FETCHING, out of the queue — unless the embeddings running sequences hold would pass
`max_held_embedding_bytes`: then the queue waits until some are released. When the fetch
lands it goes back to the head of the queue and is admitted like any other — that first
admission is its *acceptance*. An image wholly inside the cached prefix is never fetched.

Hybrid models with a prefix cache: a prefill chunk that would cross a snapshot boundary
(every k pages) ends there, since the linear layers' state exists only at chunk ends.

Speculative decoding: a decoding sequence's draft tokens (engine: Speculator) are part of
its chunk and count against the token budget. Drafts the budget, a snapshot boundary or
the free pages do not leave room for are dropped (never a preemption for a draft), and a
sequence not scheduled this step drops its drafts.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llm_svc.engine.block_manager import BlockManager
from llm_svc.engine.config import EngineConfig
from llm_svc.engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from llm_svc.engine.embeddings import EmbeddingFetcher


@dataclass
class ScheduledChunk:
    """`seq` computes tokens [start, start + num_tokens) this step."""

    seq: Sequence
    start: int
    num_tokens: int
    num_drafts: int = 0  # draft tokens ending the chunk, verified by its last rows

    @property
    def samples(self) -> bool:
        """The chunk reaches the sequence's last token, so its logits give a new token."""
        return self.start + self.num_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        fetcher: EmbeddingFetcher | None = None,
    ) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.token_budget = config.max_num_batched_tokens
        self.blocks = block_manager
        self.fetcher = fetcher
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_held_embedding_waits = 0  # steps admission waited at the embedding limit

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.num_fetching)

    @property
    def num_fetching(self) -> int:
        return len(self.fetcher) if self.fetcher is not None else 0

    def requeue_fetched(self, seqs: list[Sequence]) -> None:
        """Sequences whose embeddings arrived go back to the head of the queue, oldest first."""
        for seq in sorted(seqs, key=lambda s: s.arrival, reverse=True):
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        decoding = [s for s in self.running if s.num_uncomputed_tokens - s.num_drafts == 1]
        prefilling = [s for s in self.running if s.num_uncomputed_tokens - s.num_drafts > 1]
        for seq in decoding + prefilling:
            budget = self.token_budget - out.num_tokens
            if budget <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            count = seq.chunk_size(self._cut(seq, min(seq.num_uncomputed_tokens, budget)))
            if seq.num_drafts:
                count = self._fit_drafts(seq, count)
            count = self._make_room(seq, count, out)
            if not count:
                continue
            self.blocks.append(seq, count)
            out.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, count, seq.num_drafts))
        for seq in self.running:  # not scheduled: its drafts wait for no later step
            if seq.num_drafts and not any(chunk.seq is seq for chunk in out.chunks):
                seq.drop_drafts()
        if not out.preempted:
            self._admit(out, self.token_budget - out.num_tokens)
        return out

    def _fit_drafts(self, seq: Sequence, count: int) -> int:
        """The chunk of a decoding sequence with drafts: its token and the drafts that
        `count` (budget and boundary) and the obtainable pages leave room for."""
        if not self.blocks.can_append(seq, count):
            count = 1
        seq.drop_drafts(keep=count - 1)
        return count

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            self.blocks.match_prefix(seq)  # keeps the prefix it holds since a fetch
            missing = seq.missing_embeddings()
            if missing:
                if self.num_fetching >= self.max_num_seqs:
                    break
                assert self.fetcher is not None, "items are refused without a fetcher"
                if not self.fetcher.can_hold(seq, missing) and (self.running or self.num_fetching):
                    # At the held-embedding limit: wait for a running request to release
                    # (or a fetch to land), rather than run out of memory. With nothing
                    # running or fetching nobody would release, so it goes ahead.
                    self.num_held_embedding_waits += 1
                    break
                self.waiting.popleft()
                seq.status = SequenceStatus.FETCHING
                self.fetcher.start(seq, missing)
                continue
            count = seq.chunk_size(self._cut(seq, min(seq.num_uncomputed_tokens, budget)))
            if not self.running and not self.blocks.can_append(seq, count):
                # Nothing running will free pages for it: it takes what the pools hold.
                count = self._fitting(seq, count)
            if not count or not self.blocks.can_append(seq, count):
                if not self.running and self._release_queued_prefixes(seq):
                    continue  # the head again, with the pages the queue behind it held
                self.blocks.release(seq)
                seq.num_computed_tokens = 0
                break
            if seq.num_output_tokens == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
            self.waiting.popleft()
            self.blocks.append(seq, count)
            seq.status = SequenceStatus.RUNNING
            seq.accepted = True
            self.running.append(seq)
            out.chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, count))
            budget -= count

    def _release_queued_prefixes(self, head: Sequence) -> bool:
        """Give back the cached prefixes the waiting sequences behind `head` hold (a
        sequence keeps its match while its embeddings are fetched, and waits with it after);
        True if any did. With nothing running, nothing else frees pages: if those held
        prefixes leave the head no room, the queue would wait on itself for ever. They match
        again when their turn comes."""
        released = False
        for seq in self.waiting:
            if seq is not head and seq.block_table:
                self.blocks.release(seq)
                seq.num_computed_tokens = 0
                released = True
        return released

    def _cut(self, seq: Sequence, count: int) -> int:
        """`count`, or fewer so that the chunk ends at the next snapshot boundary it would
        cross (hybrid models only)."""
        every = self.blocks.snapshot_tokens
        if every is None:
            return count
        start = seq.num_computed_tokens
        boundary = (start // every + 1) * every
        return min(count, boundary - start)

    def _make_room(self, seq: Sequence, count: int, out: SchedulerOutput) -> int:
        """The tokens `seq` computes this step: `count`, once the newest running sequences
        are preempted until it can grow by that many. Left the newest (alone, or beside
        older ones), it takes the largest chunk the pools hold rather than preempting
        itself, and goes back to the queue only when not one token fits (then 0)."""
        while not self.blocks.can_append(seq, count):
            if self.running[-1] is not seq:
                self._preempt(self.running[-1], out)
                continue
            count = self._fitting(seq, count)
            if not count:
                self._preempt(seq, out)
            return count
        return count

    def _fitting(self, seq: Sequence, count: int) -> int:
        """The largest chunk of at most `count` tokens the pools hold for `seq` now, ending
        outside every span it may not cut (0: none)."""
        fits = seq.chunk_within(min(count, self.blocks.room(seq)))
        return fits if fits and self.blocks.can_append(seq, fits) else 0

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        for index, chunk in enumerate(out.chunks):
            if chunk.seq is seq:
                del out.chunks[index]
                break
        self.recompute(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1

    def recompute(self, seq: Sequence) -> None:
        """Drop a running sequence's KV and queue it first, to be prefilled again."""
        if seq in self.running:
            self.running.remove(seq)
        self.blocks.release(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence and give its pages back."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif self.fetcher is not None:
            self.fetcher.cancel(seq)
        self.blocks.release(seq)

    def pending_prefill_tokens(self) -> int:
        """Tokens still to prefill across waiting and running sequences (a load signal).

        A waiting sequence counts only what its cached prefix does not cover: a long
        conversation's next turn is mostly a cache hit, and counting its whole prompt made
        the pod that holds the conversation look too busy to route it there."""
        fetching = list(self.fetcher.inflight) if self.fetcher is not None else []
        running = sum(max(0, s.num_uncomputed_tokens - 1) for s in self.running)
        return running + sum(
            max(0, s.num_tokens - self.blocks.peek_prefix(s)) for s in [*self.waiting, *fetching]
        )
