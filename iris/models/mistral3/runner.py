"""Mistral 3's Pixtral vision tower + projector (patch merger), loaded alone."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from iris.models.checkpoint import find_prefix
from iris.models.fp8 import load_dense
from iris.models.runner import PreparedImage, VisionRunner, processor_kwargs

if TYPE_CHECKING:
    from iris.models.mistral3.adapter import Mistral3Adapter

_PROCESSOR_KEYS = ("size",)


class Mistral3VisionRunner(VisionRunner):
    """Each image at its own resolution (Pixtral's PIL processor, blocks of patch x merge
    pixels); a batch is padded to its largest image and goes through the tower (which
    attends within each image only) and the projector in one call, as HF's
    get_image_features does."""

    def __init__(self, adapter: Mistral3Adapter, device: Any = "cpu", dtype: Any = None) -> None:
        from transformers import AutoConfig
        from transformers.models.mistral3 import modeling_mistral3
        from transformers.models.pixtral import modeling_pixtral
        from transformers.models.pixtral.image_processing_pil_pixtral import (
            PixtralImageProcessorPil,
        )

        self.adapter = adapter
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        self.hidden_size = adapter.hidden_size
        block = adapter.rule.block
        self.processor = PixtralImageProcessorPil(
            **processor_kwargs(adapter.preprocessor, _PROCESSOR_KEYS),
            patch_size={"height": block, "width": block},
        )
        config = AutoConfig.from_pretrained(str(adapter.model_dir))
        self.feature_layer = int(config.vision_feature_layer)
        self.tower = modeling_pixtral.PixtralVisionModel._from_config(config.vision_config)
        self.projector = modeling_mistral3.Mistral3MultiModalProjector(config)
        names = adapter.weight_names
        tower_prefix = find_prefix(names, "patch_conv.weight")
        projector_prefix = find_prefix(names, "patch_merger.merging_layer.weight")
        if tower_prefix is None or projector_prefix is None:
            raise ValueError(f"no Pixtral vision tower / projector weights in {adapter.model_dir}")
        scheme = adapter.quantization
        self.tower.load_state_dict(load_dense(adapter.model_dir, tower_prefix, scheme), strict=True)
        self.projector.load_state_dict(
            load_dense(adapter.model_dir, projector_prefix, scheme), strict=True
        )
        for module in (self.tower, self.projector):
            module.to(device=self.device, dtype=self.dtype).eval()

    def preprocess(self, image) -> PreparedImage:
        out = self.processor(images=[image], return_tensors="np")
        height, width = (int(x) for x in out["image_sizes"][0])
        pixels = torch.from_numpy(np.ascontiguousarray(out["pixel_values"][0][:, :height, :width]))
        count, grid = self.adapter.image_token_count(image.width, image.height)
        block = self.adapter.rule.block
        if (height // block, width // block) != tuple(grid):
            raise RuntimeError(f"processor gave {height}x{width} pixels for grid {grid}")
        return PreparedImage(pixels, tuple(grid), count, {"image_size": (height, width)})

    @torch.inference_mode()
    def encode(self, prepared: list[PreparedImage]) -> list[torch.Tensor]:
        if not prepared:
            return []
        sizes = [p.extra["image_size"] for p in prepared]
        height, width = max(h for h, _ in sizes), max(w for _, w in sizes)
        batch = torch.zeros(len(prepared), 3, height, width, dtype=self.dtype)
        for index, p in enumerate(prepared):
            h, w = sizes[index]
            batch[index, :, :h, :w] = p.pixel_values
        batch = batch.to(self.device)
        image_sizes = torch.tensor(sizes, device=self.device)
        outputs = self.tower(batch, image_sizes=image_sizes, output_hidden_states=True)
        features = outputs.hidden_states[self.feature_layer].squeeze(0)
        features = self.projector(features, image_sizes)
        per_image = features.split([p.token_count for p in prepared])
        return [f.clone() for f in per_image]
