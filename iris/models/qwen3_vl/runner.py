"""Qwen3-VL's vision tower, merger and deepstack mergers, loaded alone from the checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from iris.models.checkpoint import find_prefix
from iris.models.fp8 import load_dense
from iris.models.runner import PreparedImage, VisionRunner, processor_kwargs

if TYPE_CHECKING:
    from iris.models.qwen3_vl.adapter import Qwen3VLAdapter

_PROCESSOR_KEYS = ("patch_size", "merge_size", "temporal_patch_size")


def _tower_class(model_type: str):
    if model_type == "qwen3_vl_moe":
        from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import (
            Qwen3VLMoeVisionModel as Tower,
        )
    else:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel as Tower
    return Tower


class Qwen3VisionRunner(VisionRunner):
    """Patches from Qwen2VLImageProcessorPil (Qwen3-VL's image processor, PIL path); one
    tower call over a batch's patches gives every image's main embedding and each deepstack
    level at once. Per image the runner returns one [token_count, (1 + levels) x hidden]
    tensor: row r is the main row r, then row r of level 0, 1, ... (the cache entry's
    layout, docs/design.md §3.2)."""

    def __init__(self, adapter: Qwen3VLAdapter, device: Any = "cpu", dtype: Any = None) -> None:
        from transformers import AutoConfig
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        self.adapter = adapter
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        self.levels = adapter.deepstack_levels
        self.hidden_size = adapter.embedding_width
        rule = adapter.rule
        self.processor = Qwen2VLImageProcessorPil(
            **processor_kwargs(adapter.preprocessor, _PROCESSOR_KEYS),
            size={"shortest_edge": rule.min_pixels, "longest_edge": rule.max_pixels},
        )
        vision_config = AutoConfig.from_pretrained(str(adapter.model_dir)).vision_config
        self.tower = _tower_class(adapter.config["model_type"])._from_config(vision_config)
        prefix = find_prefix(adapter.weight_names, "patch_embed.proj.weight")
        if prefix is None:
            raise ValueError(f"no vision patch_embed.proj.weight in {adapter.model_dir}")
        tensors = load_dense(adapter.model_dir, prefix, adapter.quantization)
        self.tower.load_state_dict(tensors, strict=True)
        self.tower.to(device=self.device, dtype=self.dtype).eval()

    def preprocess(self, image) -> PreparedImage:
        out = self.processor(images=[image], return_tensors="np")
        grid = tuple(int(x) for x in out["image_grid_thw"][0])
        token_count = grid[0] * grid[1] * grid[2] // self.adapter.merge_size**2
        pixels = torch.from_numpy(np.ascontiguousarray(out["pixel_values"]))
        return PreparedImage(pixel_values=pixels, grid=grid, token_count=token_count)

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
