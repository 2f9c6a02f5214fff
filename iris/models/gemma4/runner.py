"""Gemma 4's vision tower + multimodal embedder, loaded alone from the checkpoint (the
language model and any audio tower stay on disk)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from iris.models.checkpoint import find_prefix
from iris.models.fp8 import load_dense
from iris.models.runner import PreparedImage, VisionRunner, processor_kwargs

if TYPE_CHECKING:
    from iris.models.gemma4.adapter import Gemma4Adapter

# The image-processor settings of this family, beside the common ones.
_PROCESSOR_KEYS = ("do_resize", "patch_size", "max_soft_tokens", "pooling_kernel_size")


class Gemma4VisionRunner(VisionRunner):
    """Patches from Gemma4ImageProcessorPil (each image padded to the budget's patches, its
    patch positions beside it): a batch goes through the tower at once, which pools each
    3 × 3 block of patches into a soft token and drops the padding, then through the
    embedder into the text width (HF's get_image_features)."""

    def __init__(self, adapter: Gemma4Adapter, device: Any = "cpu", dtype: Any = None) -> None:
        from transformers import AutoConfig
        from transformers.models.gemma4.image_processing_pil_gemma4 import (
            Gemma4ImageProcessorPil,
        )
        from transformers.models.gemma4.modeling_gemma4 import (
            Gemma4MultimodalEmbedder,
            Gemma4VisionModel,
        )

        self.adapter = adapter
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        self.hidden_size = adapter.hidden_size
        kwargs = processor_kwargs(adapter.preprocessor, _PROCESSOR_KEYS)
        self.processor = Gemma4ImageProcessorPil(
            **{key: value for key, value in kwargs.items() if value is not None}
        )
        config = AutoConfig.from_pretrained(str(adapter.model_dir))
        self.tower = Gemma4VisionModel._from_config(config.vision_config)
        self.embedder = Gemma4MultimodalEmbedder(config.vision_config, config.text_config)
        names = adapter.weight_names
        tower_prefix = find_prefix(names, "patch_embedder.input_proj.weight")
        embedder_prefix = find_prefix(names, "embedding_projection.weight", exclude=("audio",))
        if tower_prefix is None or embedder_prefix is None:
            raise ValueError(f"no Gemma 4 vision tower / embedder weights in {adapter.model_dir}")
        scheme = adapter.quantization
        self.tower.load_state_dict(load_dense(adapter.model_dir, tower_prefix, scheme))
        self.embedder.load_state_dict(load_dense(adapter.model_dir, embedder_prefix, scheme))
        for module in (self.tower, self.embedder):
            module.to(device=self.device, dtype=self.dtype).eval()

    def preprocess(self, image) -> PreparedImage:
        out = self.processor(images=[image], return_tensors="np")
        count = int(np.asarray(out["num_soft_tokens_per_image"]).reshape(-1)[0])
        rows, columns = self.adapter.rule.grid(image.width, image.height)
        if count != rows * columns:
            raise RuntimeError(f"processor gave {count} soft tokens, the rule {rows}x{columns}")
        patches = torch.from_numpy(np.ascontiguousarray(out["pixel_values"]))
        positions = torch.from_numpy(np.ascontiguousarray(out["image_position_ids"]))
        return PreparedImage(patches, (rows, columns), count, {"positions": positions})

    def preprocess_video_group(self, frames: np.ndarray) -> PreparedImage:
        """One frame (uint8 [1, H, W, 3], already sampled and resized by
        iris.multimodal.video to the video rule's size) as Gemma4VideoProcessor prepares it:
        rescaled to [0, 1] (its mean 0 and std 1 leave it so), patchified row by row, padded
        to the video budget's patches with positions (-1, -1)."""
        count, height, width, _ = frames.shape
        if count != 1:
            raise ValueError(f"a Gemma 4 frame group is one frame, got {count}")
        rule = self.adapter.video_rule
        block = rule.block
        if (
            width % block
            or height % block
            or (width // block) * (height // block) > (rule.max_soft_tokens)
        ):
            raise ValueError(
                f"frame size {width}x{height} is not multiples of {block} px within "
                f"{rule.max_soft_tokens} soft tokens"
            )
        patch = rule.patch_size
        rows, columns = height // patch, width // patch
        image = torch.from_numpy(np.ascontiguousarray(frames[0])).float() / 255.0
        patches = image.reshape(rows, patch, columns, patch, 3).permute(0, 2, 1, 3, 4)
        patches = patches.reshape(rows * columns, patch * patch * 3)
        x, y = torch.meshgrid(torch.arange(columns), torch.arange(rows), indexing="xy")
        positions = torch.stack([x, y], dim=-1).reshape(rows * columns, 2)
        budget = rule.max_soft_tokens * rule.pooling_kernel_size**2
        padded = torch.zeros(1, budget, patches.shape[1])
        padded[0, : len(patches)] = patches
        padded_positions = torch.full((1, budget, 2), -1, dtype=torch.long)
        padded_positions[0, : len(positions)] = positions
        grid = (height // rule.block, width // rule.block)
        return PreparedImage(padded, grid, grid[0] * grid[1], {"positions": padded_positions})

    @torch.inference_mode()
    def encode(self, prepared: list[PreparedImage]) -> list[torch.Tensor]:
        """Pictures padded to one length (images at the image budget, frames at the video
        budget) go through the tower together; the results come back in `prepared`'s order."""
        out: list[torch.Tensor | None] = [None] * len(prepared)
        lengths = sorted({p.pixel_values.shape[1] for p in prepared})
        for length in lengths:
            batch = [i for i, p in enumerate(prepared) if p.pixel_values.shape[1] == length]
            patches = torch.cat([prepared[i].pixel_values for i in batch])
            positions = torch.cat([prepared[i].extra["positions"] for i in batch])
            rows = self.encode_patches(
                patches.to(self.device, self.dtype),
                positions.to(self.device),
                [prepared[i].token_count for i in batch],
            )
            for index, tensor in zip(batch, rows, strict=True):
                out[index] = tensor
        return out

    def encode_patches(self, patches, positions, counts: list[int]) -> list[torch.Tensor]:
        """[B, max_patches, 3·patch²] pictures (images or video frames) and their patch
        positions → one [count, hidden] tensor per entry of `counts` (rows of consecutive
        pictures)."""
        soft = self.tower(pixel_values=patches, pixel_position_ids=positions).last_hidden_state
        features = self.embedder(soft)  # the valid soft tokens of every picture, in order
        if features.shape[0] != sum(counts):
            raise RuntimeError(f"tower gave {features.shape[0]} soft tokens for {sum(counts)}")
        return [f.clone() for f in features.split(counts)]
