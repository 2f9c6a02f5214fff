"""Idefics3 / SmolVLM vision tower + connector, loaded alone from the checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from iris.models.checkpoint import find_prefix
from iris.models.fp8 import load_dense
from iris.models.runner import PreparedImage, VisionRunner, processor_kwargs

if TYPE_CHECKING:
    from iris.models.idefics3.adapter import Idefics3Adapter

# The image-processor settings of this family, beside the common ones.
_PROCESSOR_KEYS = ("size", "max_image_size", "do_image_splitting", "do_resize", "do_pad")


def _classes(model_type: str):
    if model_type == "smolvlm":
        from transformers.models.smolvlm import image_processing_pil_smolvlm as images
        from transformers.models.smolvlm import modeling_smolvlm as modeling

        return (
            images.SmolVLMImageProcessorPil,
            modeling.SmolVLMVisionTransformer,
            modeling.SmolVLMConnector,
        )
    from transformers.models.idefics3 import image_processing_pil_idefics3 as images
    from transformers.models.idefics3 import modeling_idefics3 as modeling

    return (
        images.Idefics3ImageProcessorPil,
        modeling.Idefics3VisionTransformer,
        modeling.Idefics3Connector,
    )


class IdeficsVisionRunner(VisionRunner):
    """Tiles from the family's PIL image processor; every tile is the tower's square input,
    so the tiles of a whole batch go through the tower and connector in one call."""

    def __init__(self, adapter: Idefics3Adapter, device: Any = "cpu", dtype: Any = None) -> None:
        from transformers import AutoConfig

        self.adapter = adapter
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        self.hidden_size = adapter.hidden_size
        processor_cls, tower_cls, connector_cls = _classes(adapter.config["model_type"])
        self.processor = processor_cls(**processor_kwargs(adapter.preprocessor, _PROCESSOR_KEYS))
        config = AutoConfig.from_pretrained(str(adapter.model_dir))
        self.patch_size = int(config.vision_config.patch_size)
        self.tower = tower_cls._from_config(config.vision_config)
        self.connector = connector_cls(config)
        names = adapter.weight_names
        tower_prefix = find_prefix(names, "embeddings.patch_embedding.weight")
        connector_prefix = find_prefix(names, "modality_projection.proj.weight")
        if tower_prefix is None or connector_prefix is None:
            raise ValueError(f"no Idefics3 vision tower / connector weights in {adapter.model_dir}")
        # FP8 layers of an FP8 checkpoint are dequantized here, once (iris/models/fp8.py).
        scheme = adapter.quantization
        self.tower.load_state_dict(load_dense(adapter.model_dir, tower_prefix, scheme), strict=True)
        self.connector.load_state_dict(
            load_dense(adapter.model_dir, connector_prefix, scheme), strict=True
        )
        for module in (self.tower, self.connector):
            module.to(device=self.device, dtype=self.dtype).eval()

    def preprocess(self, image) -> PreparedImage:
        out = self.processor(images=[image], return_tensors="np", return_row_col_info=True)
        rows, cols = int(out["rows"][0][0]), int(out["cols"][0][0])
        tiles = torch.from_numpy(np.ascontiguousarray(out["pixel_values"][0]))
        mask = torch.from_numpy(np.ascontiguousarray(out["pixel_attention_mask"][0]))
        expected = rows * cols + 1
        if tiles.shape[0] != expected:
            raise RuntimeError(f"processor gave {tiles.shape[0]} tiles for grid {(rows, cols)}")
        token_count = self.adapter.image_seq_len * expected
        return PreparedImage(tiles, (rows, cols), token_count, {"pixel_attention_mask": mask})

    def _patch_mask(self, pixel_mask: torch.Tensor) -> torch.Tensor:
        size = self.patch_size
        patches = pixel_mask.unfold(1, size, size).unfold(2, size, size)
        return patches.sum(dim=(-1, -2)) > 0

    @torch.inference_mode()
    def encode(self, prepared: list[PreparedImage]) -> list[torch.Tensor]:
        if not prepared:
            return []
        tiles = torch.cat([p.pixel_values for p in prepared]).to(self.device, self.dtype)
        pixel_mask = torch.cat([p.extra["pixel_attention_mask"] for p in prepared])
        patch_mask = self._patch_mask(pixel_mask.to(self.device))
        hidden = self.tower(pixel_values=tiles, patch_attention_mask=patch_mask).last_hidden_state
        features = self.connector(hidden)  # [tiles, image_seq_len, text hidden]
        per_image = features.split([p.pixel_values.shape[0] for p in prepared])
        return [f.reshape(-1, f.shape[-1]).clone() for f in per_image]
