"""One request inside the engine: its tokens, its pages and its progress."""

from __future__ import annotations

import contextvars
import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from llm_svc.engine.sampling_params import SamplingParams

_arrival = itertools.count()

# The id of a token sampled on the device and not read by the host yet (engine: overlap).
PLACEHOLDER = -1


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    FETCHING = "fetching"  # waiting for its image embeddings (off the engine loop)
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"  # its own error ended it (before or after acceptance): `Sequence.error`


@dataclass
class TokenLogprobs:
    """The sampled token's log-probability and the `logprobs` most likely alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


class Sequence:
    """Prompt + generated tokens; `num_computed_tokens` of them have KV in `block_table`.

    `block_table[i]` is the page holding positions [i*page, (i+1)*page); the first
    `len(tree_nodes)` pages are shared through the radix cache, the rest are private.
    A model with sliding-window layers has a second table, `window_table`, for their pages
    (same positions, same page size): entries before `window_start` have left the window
    and hold the pool's null page (llm_svc/engine/window_pages.py).
    `items` (multimodal items with offsets into token_ids) and `mrope_positions` ([3, N]
    for Qwen2-VL) are carried for the multimodal path; None/empty means plain text.
    `grammar` is the request's compiled grammar and matcher (constrained requests only).
    `embeddings[i]` is item i's embedding once fetched, held until the sequence ends (so
    preemption re-prefills from it and cache eviction cannot break assembly). The sequence
    is *accepted* once the scheduler first runs it, i.e. every embedding it needs is held.

    The last `num_pending` token ids may be PLACEHOLDERs: tokens of launched steps the host
    has not read yet (llm_svc.engine.pending). The scheduler and the runner count them (the
    device computes them); the outputs (`output_token_ids`, `num_output_tokens`) do not.

    Speculative decoding: for the one step that verifies them, the `num_drafts` draft
    tokens proposed for a decoding sequence sit after its last token (before that step's
    placeholder); they are no output until accepted (llm_svc/engine/spec).
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        items: list[Any] | None = None,
        mrope_positions: np.ndarray | None = None,
        cache_salt: bytes = b"",
    ) -> None:
        self.request_id = request_id
        self.cache_salt = cache_salt  # the tenant's radix namespace (b"": the shared one)
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params
        self.items = items or []
        # Half-open [start, end) token spans that attend to themselves both ways (Gemma 3's
        # images): a prefill chunk or a resumed prefix never ends strictly inside one.
        self.uncut_spans: list[tuple[int, int]] = []
        self.mrope_positions = mrope_positions
        self.arrival = next(_arrival)
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_pending = 0
        self.num_drafts = 0
        self.spec: Any = None  # spec.SpecState: its recent acceptance (speculation only)
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at admission
        self.block_table: list[int] = []
        self.tree_nodes: list[Any] = []
        self.window_table: list[int] = []
        self.window_start = 0
        self.state_slot: int | None = None  # hybrid models: its slot in the StatePool
        self.finish_reason: FinishReason | None = None
        self.text = ""
        self.num_text_emitted = 0
        self.num_tokens_emitted = 0
        self.logprobs: list[TokenLogprobs] = []
        # A seeded request's own generator, made by the sampler on its device at first use.
        self.generator: torch.Generator | None = None
        self.detokenizer: Any = None
        self.context: contextvars.Context | None = None  # the caller's, for off-loop work
        self.peeked_prefix_tokens: int | None = None  # cached prefix seen while waiting
        self.tier_counted = False  # its prefix's tiers counted (host tier's lookups)
        self.store_checked = False  # the KV store was asked for its pages
        self.embeddings: dict[int, torch.Tensor] = {}
        self.accepted = False
        self.error: Exception | None = None
        self.grammar: Any = None  # grammar.RequestGrammar when params.constraint is set

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Generated tokens the host has read (pending ones excluded)."""
        return self._num_read - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens : self._num_read]

    @property
    def _num_read(self) -> int:
        """Tokens that are the sequence's own: no placeholder, no draft."""
        return len(self.token_ids) - self.num_pending - self.num_drafts

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def positions(self, start: int, end: int) -> np.ndarray:
        """Rotary positions of tokens [start, end): [n] for text, [3, n] with M-RoPE. Tokens
        past the stored M-RoPE table (generated ones) continue from its maximum + 1."""
        if self.mrope_positions is None:
            return np.arange(start, end, dtype=np.int64)
        table = self.mrope_positions
        stored = table[:, start:end]
        extra = end - max(start, table.shape[1])
        if extra <= 0:
            return stored
        first = int(table.max()) + 1 + max(start, table.shape[1]) - table.shape[1]
        tail = np.arange(first, first + extra, dtype=np.int64)
        return np.concatenate([stored, np.broadcast_to(tail, (3, extra))], axis=1)

    def chunk_size(self, count: int) -> int:
        """`count` tokens from `num_computed_tokens`, grown to the end of an uncut span the
        chunk would otherwise end inside (so a chunk exceeds its budget by at most one span)."""
        end = self.num_computed_tokens + count
        for start, stop in self.uncut_spans:
            if start < end < stop:
                end = stop
        return end - self.num_computed_tokens

    def chunk_within(self, count: int) -> int:
        """At most `count` tokens from `num_computed_tokens`, cut back to the start of an
        uncut span the chunk would end inside (0 if that is where it starts)."""
        end = self.num_computed_tokens + count
        for start, stop in self.uncut_spans:
            if start < end < stop:
                end = max(start, self.num_computed_tokens)
        return end - self.num_computed_tokens

    def attend_until(self, start: int, end: int) -> np.ndarray:
        """For tokens [start, end) of a chunk, the last position each may attend to: itself,
        or the end of the uncut span it sits in."""
        until = np.arange(start, end, dtype=np.int64)
        for first, stop in self.uncut_spans:
            if first < end and stop > start:
                until[max(first, start) - start : min(stop, end) - start] = stop - 1
        return until

    def items_needed_from(self, start: int) -> list[int]:
        """Indices of the items with tokens at or past `start` (those a prefill from `start`
        must scatter in)."""
        return [
            index
            for index, item in enumerate(self.items)
            if any(end >= start for _, end in item.offsets)
        ]

    def missing_embeddings(self) -> list[int]:
        """Items the prefill from `num_computed_tokens` needs and this sequence does not hold."""
        needed = self.items_needed_from(self.num_computed_tokens)
        return [index for index in needed if index not in self.embeddings]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def add_drafts(self, drafts: list[int]) -> None:
        """Draft tokens to verify in the next step (no placeholder is pending)."""
        assert not self.num_pending and not self.num_drafts, "drafts follow read tokens only"
        self.token_ids.extend(drafts)
        self.num_drafts = len(drafts)

    def drop_drafts(self, keep: int = 0) -> None:
        """Keep the first `keep` drafts, drop the rest (the step will not verify them)."""
        drop = self.num_drafts - keep
        if drop > 0:
            end = len(self.token_ids) - self.num_pending
            del self.token_ids[end - drop : end]
            self.num_drafts = keep

    def add_placeholder(self) -> int:
        """A token sampled on the device joins the sequence unread; returns its index."""
        self.token_ids.append(PLACEHOLDER)
        self.num_pending += 1
        return len(self.token_ids) - 1

    def resolve_placeholder(self, index: int, token_id: int) -> None:
        """The host has read the token at `index` (the oldest pending one)."""
        self.token_ids[index] = token_id
        self.num_pending -= 1

    def drop_placeholders(self) -> None:
        """Finished: tokens still pending (and drafts) will never count."""
        self.drop_drafts()
        if self.num_pending:
            del self.token_ids[-self.num_pending :]
            self.num_pending = 0

    def reset_for_recompute(self) -> None:
        """After preemption: KV is gone; prompt and output so far are prefilled again."""
        self.drop_drafts()
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table = []
        self.tree_nodes = []
        self.window_table = []
        self.window_start = 0
