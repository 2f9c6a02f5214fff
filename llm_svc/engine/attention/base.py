"""The attention backend contract: paged KV writes and reads for one packed step.

A step packs the new tokens of every scheduled sequence into one flat batch of T tokens
(sequence after sequence). The runner describes it with `AttentionMetadata`; a backend
`plan`s once per step (index building shared by all layers), then each layer calls
`forward`, which stores the step's K/V into the paged cache and attends each sequence's
queries to its whole context (cached pages + the new tokens), causally; a sliding-window
layer passes `window` W and a query at position q then sees only keys at k with q - k < W
(a model with sliding layers keeps their pages in a pool of their own and frees those
outside the window: its tables point freed positions at a null page, always masked; see
kinds.py). With
`attend_until` (a prefill chunk holding whole image spans whose tokens see each other both
ways), a query at q sees the keys at k <= attend_until[q] instead of k <= q, still within
its window: window AND (causal OR same span), as transformers builds Gemma 3's masks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from llm_svc.engine.transfer import to_device


@dataclass
class KVCache:
    """K and V for every layer, `num_pages` pages of `page_size` token slots each.

    Slot s of the flat view belongs to page s // page_size; shapes [layers, slots, kv_heads,
    head_dim].
    """

    k: torch.Tensor
    v: torch.Tensor
    page_size: int

    @classmethod
    def allocate(
        cls,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> KVCache:
        shape = (num_layers, num_pages * page_size, num_kv_heads, head_dim)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
            page_size,
        )

    @staticmethod
    def bytes_per_page(
        num_layers: int, page_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * page_size * num_kv_heads * head_dim * itemsize

    @property
    def num_pages(self) -> int:
        return self.k.shape[1] // self.page_size

    def store(
        self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one step's k/v [T, kv_heads, d] at `slots` [T] of `layer`; returns that
        layer's (k, v) cache views [slots, kv_heads, d]."""
        k_cache, v_cache = self.k[layer], self.v[layer]
        k_cache.index_copy_(0, slots, k)
        v_cache.index_copy_(0, slots, v)
        return k_cache, v_cache

    def layer(
        self, layer: int, slots: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`layer`'s (k, v) cache views, after storing the step's k/v there; with k and v
        None (a layer reading another layer's KV, Gemma 4) nothing is stored."""
        if k is None:
            return self.k[layer], self.v[layer]
        return self.store(layer, slots, k, v)


@dataclass
class AttentionMetadata:
    """One step, B sequences: sequence i owns flat tokens [query_starts[i], +query_lens[i]),
    which are the last query_lens[i] of its context_lens[i] positions; its pages are
    block_tables[i] (padded with 0 past its last page). slot_mapping[t] is the cache slot
    of flat token t."""

    slot_mapping: torch.Tensor  # [T] int64
    query_starts: list[int]
    query_lens: list[int]
    context_lens: list[int]
    block_tables: torch.Tensor  # [B, max_pages] int64
    # [T] int64, the last position each flat token attends to (past itself inside an image
    # span that attends both ways, Gemma 3); None: every token is causal.
    attend_until: torch.Tensor | None = None
    # Sliding-window layers with a pool of their own (attention/kinds.py): the same step's
    # slots and tables in that pool; None when every layer reads the pool above.
    window_slot_mapping: torch.Tensor | None = None
    window_block_tables: torch.Tensor | None = None

    def last_tokens(self, entries: list[int], rows: torch.Tensor) -> AttentionMetadata:
        """The same step with only the last token of sequences `entries` as queries (one
        query each; `rows` [len(entries)] their flat indices, on the device): what layers
        whose output only feeds the sampled rows need (Gemma 4's KV-shared layers). A last
        token sees its whole context causally, so `attend_until` is dropped."""
        index = None
        if entries:
            index = to_device(np.asarray(entries, dtype=np.int64), self.block_tables.device)

        def pick(table: torch.Tensor | None) -> torch.Tensor | None:
            if table is None:
                return None
            return table.index_select(0, index) if index is not None else table[:0]

        window_slots = self.window_slot_mapping
        return AttentionMetadata(
            slot_mapping=self.slot_mapping.index_select(0, rows),
            query_starts=list(range(len(entries))),
            query_lens=[1] * len(entries),
            context_lens=[self.context_lens[i] for i in entries],
            block_tables=pick(self.block_tables),
            window_slot_mapping=None
            if window_slots is None
            else window_slots.index_select(0, rows),
            window_block_tables=pick(self.window_block_tables),
        )


class AttentionBackend(ABC):
    """Paged attention over a `KVCache`; one instance per model runner."""

    name: str = ""

    def __init__(self, kv_cache: KVCache) -> None:
        self.kv_cache = kv_cache

    @abstractmethod
    def plan(self, meta: AttentionMetadata) -> None:
        """Prepare the step described by `meta` (called once, before the layers run)."""

    @abstractmethod
    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scale: float | None = None,
        window: int | None = None,
        causal: bool = False,
    ) -> torch.Tensor:
        """q [T, heads, d], k/v [T, kv_heads, d] → [T, heads, d]; stores k/v in the cache.
        `scale`: the softmax scale (None: d ** -0.5); `window`: see the module docstring.
        `causal`: this layer ignores `attend_until` (Gemma 4's full layers, whose image
        spans stay causal while its sliding layers see them both ways).
        k and v None: the layer reads the KV already stored at `layer` this step (a
        KV-shared layer, attention/kinds.py) and stores nothing."""
