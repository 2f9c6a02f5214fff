"""Qwen3-VL's vision tower, merger and deepstack mergers, loaded alone from the checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from iris.models.qwen2_vl.runner import QwenVisionRunner
from iris.models.runner import PreparedImage

if TYPE_CHECKING:
    from iris.models.qwen3_vl.adapter import Qwen3VLAdapter

# Qwen3VLVideoProcessor's image_mean / image_std (IMAGENET_STANDARD_*).
VIDEO_MEAN = (0.5, 0.5, 0.5)
VIDEO_STD = (0.5, 0.5, 0.5)


def _tower_class(model_type: str):
    if model_type == "qwen3_vl_moe":
        from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import (
            Qwen3VLMoeVisionModel as Tower,
        )
    else:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel as Tower
    return Tower


class Qwen3VisionRunner(QwenVisionRunner):
    """Patches from Qwen2VLImageProcessorPil (Qwen3-VL's image processor, PIL path); one
    tower call over a batch's patches gives every image's main embedding and each deepstack
    level at once. Per image the runner returns one [token_count, (1 + levels) x hidden]
    tensor: row r is the main row r, then row r of level 0, 1, ... (the cache entry's
    layout, docs/design/cache.md)."""

    def __init__(self, adapter: Qwen3VLAdapter, device: Any = "cpu", dtype: Any = None) -> None:
        super().__init__(adapter, device, dtype)
        self.levels = adapter.deepstack_levels
        self.hidden_size = adapter.embedding_width

    video_mean = VIDEO_MEAN
    video_std = VIDEO_STD

    @staticmethod
    def tower_class(model_type: str):
        return _tower_class(model_type)

    @torch.inference_mode()
    def encode(self, prepared: list[PreparedImage]) -> list[torch.Tensor]:
        if not prepared:
            return []
        pixels = torch.cat([p.pixel_values for p in prepared]).to(self.device, self.dtype)
        grid_thw = torch.tensor([p.grid for p in prepared], dtype=torch.long, device=self.device)
        out = self.tower(pixels, grid_thw=grid_thw)
        levels = list(out.deepstack_features)
        if len(levels) != self.levels:
            raise RuntimeError(f"vision tower returned {len(levels)} deepstack levels, "
                               f"the config names {self.levels}")  # fmt: skip
        wide = torch.cat([out.pooler_output, *levels], dim=1)
        rows = [p.token_count for p in prepared]
        if wide.shape[0] != sum(rows):
            raise RuntimeError(f"vision tower returned {wide.shape[0]} rows for {sum(rows)} tokens")
        return [chunk.clone(memory_format=torch.contiguous_format) for chunk in wide.split(rows)]
