"""Attention with torch's scaled_dot_product_attention: works on CPU and GPU.

Single-token queries (decode) run as padded batches per layer: one batch, or two when
splitting the rows by context length saves enough of the padding (`decode_groups`); longer
queries (prefill chunks) run one sequence at a time with a causal mask offset by the
cached prefix (and, on a sliding-window layer, by the window: q - k < W), opened up to
`attend_until` inside an image span that attends both ways. Context is
gathered a whole page at a time (one index per page, not per
token), which is what makes this fast enough on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from llm_svc.engine.attention.base import AttentionBackend, AttentionMetadata
from llm_svc.engine.transfer import to_device


@dataclass
class _Chunk:
    tokens: slice
    pages: torch.Tensor  # [pages] of the sequence's context
    context: int
    mask: torch.Tensor | None  # [query, context] True = may attend; None = plain causal
    rows: torch.Tensor  # [query, 1] each query's position
    until: torch.Tensor  # [query, 1] the last position each query sees (rows when causal)
    windowed: dict  # window → its mask, built on first use in the step
    causal_mask: torch.Tensor | None = None  # `mask` without `until` (None: plain causal)

    def mask_for(self, window: int | None) -> torch.Tensor | None:
        # Every key lies inside the window of every query while the context fits in it:
        # then the window changes nothing, and SDPA keeps its causal fast path.
        if window is None or self.context <= window:
            return self.mask
        if window not in self.windowed:
            keys = torch.arange(self.context, device=self.rows.device)[None, :]
            # window AND (causal OR same span): a span's later keys are inside the window.
            self.windowed[window] = (keys <= self.until) & (keys > self.rows - window)
        return self.windowed[window]


@dataclass
class _DecodeBatch:
    token_index: torch.Tensor  # [Bd] flat positions of the single-token queries
    pages: torch.Tensor  # [Bd * max_pages] (rows padded with page 0, masked out)
    width: int  # max_pages * page_size
    mask: torch.Tensor  # [Bd, 1, 1, width]
    lengths: torch.Tensor  # [Bd] context lengths
    windowed: dict  # window → its mask, built on first use in the step

    def mask_for(self, window: int | None) -> torch.Tensor:
        if window is None or self.width <= window:
            return self.mask
        if window not in self.windowed:
            keys = torch.arange(self.width, device=self.lengths.device)[None, :]
            # The query sits at position length - 1: it sees keys k > length - 1 - W.
            visible = (keys < self.lengths[:, None]) & (keys >= self.lengths[:, None] - window)
            self.windowed[window] = visible[:, None, None, :]
        return self.windowed[window]


# Split the decode rows in two batches only when that cuts the padded key slots gathered
# and attended by at least this share: a second batch costs one more gather and SDPA call
# per layer.
SPLIT_SAVING = 0.25


def decode_groups(contexts: list[int]) -> list[list[int]]:
    """The decode rows (indices into `contexts`) as one group, or as two (shorter and
    longer contexts) when the split leaves at most 1 - SPLIT_SAVING of one batch's padded
    width x rows. A batch pads every row to its longest context."""
    order = sorted(range(len(contexts)), key=contexts.__getitem__)
    longest, count = contexts[order[-1]], len(order)
    best, cut = count * longest, 0
    for split in range(1, count):
        area = split * contexts[order[split - 1]] + (count - split) * longest
        if area < best:
            best, cut = area, split
    if cut and best <= (1 - SPLIT_SAVING) * count * longest:
        return [sorted(order[:cut]), sorted(order[cut:])]
    return [list(range(count))]


class SdpaBackend(AttentionBackend):
    name = "sdpa"

    def plan(self, meta: AttentionMetadata) -> None:
        page_size = self.kv_cache.page_size
        device = meta.slot_mapping.device
        self._slot_mapping = meta.slot_mapping
        self._chunks: list[_Chunk] = []
        self._decode: list[_DecodeBatch] = []
        decode = [i for i, n in enumerate(meta.query_lens) if n == 1]
        if decode:
            for group in decode_groups([meta.context_lens[i] for i in decode]):
                self._decode.append(self._decode_batch(meta, [decode[j] for j in group]))
        for i, query_len in enumerate(meta.query_lens):
            if query_len == 1:
                continue
            context = meta.context_lens[i]
            pages = meta.block_tables[i, : -(-context // page_size)]
            mask = None
            rows = torch.arange(query_len, device=device)[:, None] + (context - query_len)
            start = meta.query_starts[i]
            tokens = slice(start, start + query_len)
            until = rows
            if meta.attend_until is not None:
                until = meta.attend_until[tokens][:, None]
            if context > query_len or meta.attend_until is not None:
                mask = torch.arange(context, device=device)[None, :] <= until
            causal = None
            if context > query_len:
                causal = torch.arange(context, device=device)[None, :] <= rows
            self._chunks.append(_Chunk(tokens, pages, context, mask, rows, until, {}, causal))

    def _decode_batch(self, meta: AttentionMetadata, decode_rows: list[int]) -> _DecodeBatch:
        # Sizes come from the host lists, never from a device tensor (no sync); the rows,
        # lengths and starts travel in one host→device copy.
        page_size, device = self.kv_cache.page_size, meta.slot_mapping.device
        count = len(decode_rows)
        contexts = [meta.context_lens[i] for i in decode_rows]
        starts = [meta.query_starts[i] for i in decode_rows]
        host = np.asarray([*decode_rows, *contexts, *starts], dtype=np.int64)
        index = to_device(host, device)
        rows, lengths, token_index = index[:count], index[count : 2 * count], index[2 * count :]
        max_pages = -(-max(contexts) // page_size)
        tables = meta.block_tables.index_select(0, rows)[:, :max_pages]
        width = max_pages * page_size
        positions = torch.arange(width, device=device)
        mask = (positions[None, :] < lengths[:, None])[:, None, None, :]
        return _DecodeBatch(token_index, tables.reshape(-1), width, mask, lengths, {})

    def _gather(self, cache: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
        """[slots, kv_heads, d] cache → [len(pages) * page_size, kv_heads, d]."""
        size = self.kv_cache.page_size
        paged = cache.view(-1, size, *cache.shape[1:])
        return paged.index_select(0, pages).reshape(-1, *cache.shape[1:])

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        *,
        scale: float | None = None,
        window: int | None = None,
        causal: bool = False,
    ) -> torch.Tensor:
        k_cache, v_cache = self.kv_cache.layer(layer, self._slot_mapping, k, v)
        out = torch.empty_like(q)
        for batch in self._decode:
            rows = batch.token_index.shape[0]
            query = q[batch.token_index].unsqueeze(2)  # [Bd, heads, 1, d]
            keys = self._gather(k_cache, batch.pages).view(rows, batch.width, *k_cache.shape[1:])
            values = self._gather(v_cache, batch.pages).view(rows, batch.width, *v_cache.shape[1:])
            result = F.scaled_dot_product_attention(
                query,
                keys.transpose(1, 2),
                values.transpose(1, 2),
                attn_mask=batch.mask_for(window),
                scale=scale,
                enable_gqa=True,
            )
            out[batch.token_index] = result.squeeze(2)
        for chunk in self._chunks:
            query = q[chunk.tokens].transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
            keys = self._gather(k_cache, chunk.pages)[: chunk.context]
            values = self._gather(v_cache, chunk.pages)[: chunk.context]
            mask = chunk.causal_mask if causal and window is None else chunk.mask_for(window)
            result = F.scaled_dot_product_attention(
                query,
                keys.transpose(0, 1).unsqueeze(0),
                values.transpose(0, 1).unsqueeze(0),
                attn_mask=mask,
                is_causal=mask is None,
                scale=scale,
                enable_gqa=True,
            )
            out[chunk.tokens] = result.squeeze(0).transpose(0, 1)
        return out
