"""Attention with Iris's Triton kernels (iris_kernels/paged_attention_*.py), reading the paged
KV cache in place through the block tables.

Per step the decode rows (one query token) run as one decode launch (GQA-grouped, split-K
over long contexts) and every prefill chunk as one extend launch. `plan` builds the
kernels' index columns from the host-side lengths the scheduler already has and moves them
with one host→device copy, so nothing on the hot path waits for the device. Runs on CUDA,
or on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1), which is how the tests
compare it with the SDPA backend, its torch twin.
"""

from __future__ import annotations

import numpy as np
import torch

from iris_kernels.paged_attention_decode import paged_decode_attention, unsupported_reason
from iris_kernels.paged_attention_extend import paged_extend_attention, query_blocks
from llm_svc.engine.attention.base import AttentionBackend, AttentionMetadata, KVCache
from llm_svc.engine.transfer import to_device


class TritonBackend(AttentionBackend):
    name = "triton"

    def __init__(self, kv_cache: KVCache) -> None:
        reason = unsupported_reason(kv_cache.k.shape[-1], kv_cache.k.dtype)
        if reason:
            raise ValueError(f"the triton attention backend cannot serve this model: {reason}")
        super().__init__(kv_cache)

    def plan(self, meta: AttentionMetadata) -> None:
        head_dim = self.kv_cache.k.shape[-1]
        decode = [i for i, n in enumerate(meta.query_lens) if n == 1]
        extend = [i for i, n in enumerate(meta.query_lens) if n > 1]
        owners, firsts = query_blocks([meta.query_lens[i] for i in extend], head_dim)
        # Columns, in kernel order: decode (token, table row, context); extend chunks
        # (start, query length, context, table row); extend blocks (chunk, first row).
        columns = [
            [meta.query_starts[i] for i in decode], decode,
            [meta.context_lens[i] for i in decode],
            [meta.query_starts[i] for i in extend], [meta.query_lens[i] for i in extend],
            [meta.context_lens[i] for i in extend], extend,
            owners, firsts,
        ]  # fmt: skip
        host = np.asarray([x for column in columns for x in column], dtype=np.int32)
        flat = to_device(host, meta.slot_mapping.device)
        decode_end, chunks_end = 3 * len(decode), 3 * len(decode) + 4 * len(extend)
        self._slot_mapping = meta.slot_mapping
        self._block_tables = meta.block_tables
        self._num_decode, self._num_chunks, self._num_blocks = len(decode), len(extend), len(owners)
        self._decode_plan = flat[:decode_end]
        self._chunks = flat[decode_end:chunks_end]
        self._blocks = flat[chunks_end:]
        self._max_decode_context = max((meta.context_lens[i] for i in decode), default=0)
        self._attend_until = meta.attend_until

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
        if q.stride(-1) != 1:
            q = q.contiguous()
        out = torch.empty_like(q)
        page_size = self.kv_cache.page_size
        if self._num_decode:
            paged_decode_attention(
                q, k_cache, v_cache, out, self._block_tables, self._decode_plan,
                self._num_decode, self._max_decode_context, page_size,
                scale=scale, window=window,
            )  # fmt: skip
        if self._num_blocks:
            paged_extend_attention(
                q, k_cache, v_cache, out, self._block_tables, self._chunks, self._blocks,
                self._num_chunks, self._num_blocks, page_size,
                scale=scale, window=window, attend_until=None if causal else self._attend_until,
            )  # fmt: skip
        return out
