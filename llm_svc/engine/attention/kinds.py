"""Attention over one pool of pages per layer kind: full-attention layers read one KV cache,
sliding-window layers another (docs/design/engine.md).

`KindsBackend` holds one backend per pool and sends each layer to its kind's, with the
layer's index inside that pool. Both pools see the same step (same queries, lengths and
positions); only the slots and block tables differ, so each backend plans once per step
from the metadata with its pool's columns swapped in.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from llm_svc.engine.attention.base import AttentionBackend, AttentionMetadata


class KindsBackend(AttentionBackend):
    """`full` serves the layers in `full_layers`, `sliding` those in `sliding_layers` (the
    model's layer indices, in order); `full` is None when every layer slides."""

    def __init__(
        self,
        full: AttentionBackend | None,
        sliding: AttentionBackend,
        full_layers: list[int],
        sliding_layers: list[int],
    ) -> None:
        super().__init__(sliding.kv_cache)
        self.name = sliding.name
        self.full, self.sliding = full, sliding
        self._route: dict[int, tuple[AttentionBackend, int]] = {}
        for local, layer in enumerate(full_layers):
            self._route[layer] = (full, local)
        for local, layer in enumerate(sliding_layers):
            self._route[layer] = (sliding, local)

    def plan(self, meta: AttentionMetadata) -> None:
        assert meta.window_block_tables is not None, "a step without its window tables"
        if self.full is not None:
            self.full.plan(meta)
        self.sliding.plan(
            replace(meta, slot_mapping=meta.window_slot_mapping,
                    block_tables=meta.window_block_tables)
        )  # fmt: skip

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scale: float | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        backend, local = self._route[layer]
        return backend.forward(local, q, k, v, scale=scale, window=window)
