"""Attention over one pool of pages per layer kind: full-attention layers read one KV cache,
sliding-window layers another (docs/design/engine.md), each pool with its own page shape
(Gemma 4's full layers have wider heads than its sliding ones).

`KindsBackend` holds one backend per pool and sends each layer to its kind's, with the
layer's index inside that pool. Both pools see the same step (same queries, lengths and
positions); only the slots and block tables differ, so each backend plans once per step
from the metadata with its pool's columns swapped in. A layer that reuses another layer's
KV (Gemma 4's KV-shared layers) holds no pool layer: it is sent to its source's, and reads
it without storing (its k and v are None).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from llm_svc.engine.attention.base import AttentionBackend, AttentionMetadata


class KindsBackend(AttentionBackend):
    """`full` serves the layers in `full_layers`, `sliding` those in `sliding_layers` (the
    model's layer indices, in order: the layers that keep KV); `full` is None when every
    layer slides. `readers` maps a layer that reuses KV to the layer it reads."""

    def __init__(
        self,
        full: AttentionBackend | None,
        sliding: AttentionBackend,
        full_layers: list[int],
        sliding_layers: list[int],
        readers: dict[int, int] | None = None,
    ) -> None:
        super().__init__(sliding.kv_cache)
        self.name = sliding.name
        self.full, self.sliding = full, sliding
        self._route: dict[int, tuple[AttentionBackend, int]] = {}
        for local, layer in enumerate(full_layers):
            self._route[layer] = (full, local)
        for local, layer in enumerate(sliding_layers):
            self._route[layer] = (sliding, local)
        for reader, source in (readers or {}).items():
            self._route[reader] = self._route[source]

    def plan(self, meta: AttentionMetadata) -> None:
        # A step without window tables (the memory profile's, whose pools are scratch)
        # addresses both pools with the same pages.
        slots, tables = meta.window_slot_mapping, meta.window_block_tables
        if tables is None:
            slots, tables = meta.slot_mapping, meta.block_tables
        if self.full is not None:
            self.full.plan(meta)
        self.sliding.plan(replace(meta, slot_mapping=slots, block_tables=tables))

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
        backend, local = self._route[layer]
        return backend.forward(local, q, k, v, scale=scale, window=window, causal=causal)
