"""Qwen2-VL / Qwen2.5-VL vision tower + merger, loaded alone from the checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from iris.models.checkpoint import find_prefix
from iris.models.fp8 import load_dense
from iris.models.runner import PreparedImage, VisionRunner, processor_kwargs

if TYPE_CHECKING:
    from iris.models.qwen2_vl.adapter import Qwen2VLAdapter

# The image-processor settings of this family, beside the common ones.
_PROCESSOR_KEYS = ("patch_size", "merge_size", "temporal_patch_size")


def _tower_class(model_type: str):
    if model_type == "qwen2_5_vl":
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VisionTransformerPretrainedModel as Tower,
        )
    else:
        from transformers.models.qwen2_vl.modeling_qwen2_vl import (
            Qwen2VisionTransformerPretrainedModel as Tower,
        )
    return Tower


class QwenVisionRunner(VisionRunner):
    """Patches from Qwen2VLImageProcessorPil (the PIL path: the torchvision one does not
    import here); one tower call over the concatenated patches of a batch."""

    def __init__(self, adapter: Qwen2VLAdapter, device: Any = "cpu", dtype: Any = None) -> None:
        from transformers import AutoConfig
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        self.adapter = adapter
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        self.hidden_size = adapter.hidden_size
        rule = adapter.rule
        self.processor = Qwen2VLImageProcessorPil(
            **processor_kwargs(adapter.preprocessor, _PROCESSOR_KEYS),
            size={"shortest_edge": rule.min_pixels, "longest_edge": rule.max_pixels},
        )
        vision_config = AutoConfig.from_pretrained(str(adapter.model_dir)).vision_config
        self.tower = self.tower_class(adapter.config["model_type"])._from_config(vision_config)
        prefix = find_prefix(adapter.weight_names, "patch_embed.proj.weight")
        if prefix is None:
            raise ValueError(f"no vision patch_embed.proj.weight in {adapter.model_dir}")
        # FP8 layers of an FP8 checkpoint are dequantized here, once (iris/models/fp8.py).
        tensors = load_dense(adapter.model_dir, prefix, adapter.quantization)
        self.tower.load_state_dict(tensors, strict=True)
        self.tower.to(device=self.device, dtype=self.dtype).eval()

    # The video processor's image_mean / image_std (Qwen2VLVideoProcessor: OpenAI CLIP's).
    video_mean = (0.48145466, 0.4578275, 0.40821073)
    video_std = (0.26862954, 0.26130258, 0.27577711)

    @staticmethod
    def tower_class(model_type: str):
        """The transformers vision-tower class for the checkpoint's `model_type`."""
        return _tower_class(model_type)

    def preprocess(self, image) -> PreparedImage:
        out = self.processor(images=[image], return_tensors="np")
        grid = tuple(int(x) for x in out["image_grid_thw"][0])
        token_count = grid[0] * grid[1] * grid[2] // self.adapter.merge_size**2
        pixels = torch.from_numpy(np.ascontiguousarray(out["pixel_values"]))
        return PreparedImage(pixel_values=pixels, grid=grid, token_count=token_count)

    def preprocess_video_group(self, frames: np.ndarray) -> PreparedImage:
        """One frame group (uint8 [T, H, W, 3], already sampled and resized by
        iris.multimodal.video) as the video processor prepares it: rescaled, normalised
        with the video processor's mean and std, patchified in its layout; grid (1, h, w).
        The tower attends within one temporal group, so the group's rows are exactly its
        rows inside the whole video's."""
        sampling = self.adapter.video_sampling
        count, height, width, _ = frames.shape
        if count != sampling.temporal_patch_size:
            raise ValueError(
                f"a frame group has {sampling.temporal_patch_size} frames, got {count}"
            )
        patch, merge = sampling.patch_size, sampling.merge_size
        if height % (patch * merge) or width % (patch * merge):
            raise ValueError(f"frame size {width}x{height} is not a multiple of {patch * merge}")
        mean = torch.tensor(self.video_mean, dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(self.video_std, dtype=torch.float32).view(1, 3, 1, 1)
        video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
        video = (video / 255.0 - mean) / std
        grid_h, grid_w = height // patch, width // patch
        patches = video.reshape(
            1, count, 3, grid_h // merge, merge, patch, grid_w // merge, merge, patch
        ).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        pixels = patches.reshape(grid_h * grid_w, 3 * count * patch * patch).contiguous()
        grid = (1, grid_h, grid_w)
        return PreparedImage(
            pixel_values=pixels, grid=grid, token_count=grid_h * grid_w // merge**2
        )

    @torch.inference_mode()
    def encode(self, prepared: list[PreparedImage]) -> list[torch.Tensor]:
        if not prepared:
            return []
        pixels = torch.cat([p.pixel_values for p in prepared]).to(self.device, self.dtype)
        grid_thw = torch.tensor([p.grid for p in prepared], dtype=torch.long, device=self.device)
        merged = self.tower(pixels, grid_thw=grid_thw).pooler_output
        rows = [p.token_count for p in prepared]
        if merged.shape[0] != sum(rows):
            raise RuntimeError(
                f"vision tower returned {merged.shape[0]} rows for {sum(rows)} tokens"
            )
        return [chunk.clone(memory_format=torch.contiguous_format) for chunk in merged.split(rows)]
