"""InternVL's vision tower + projector, loaded alone from the checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from iris.models.checkpoint import find_prefix
from iris.models.fp8 import load_dense
from iris.models.runner import PreparedImage, VisionRunner, processor_kwargs

if TYPE_CHECKING:
    from iris.models.internvl.adapter import InternVLAdapter

_PROCESSOR_KEYS = ("size", "min_patches", "max_patches")


class InternVLVisionRunner(VisionRunner):
    """Tiles (and the thumbnail) from GotOcr2's PIL image processor with cropping on, as
    InternVLProcessor runs it; every tile is the tower's square input, so a whole batch's
    tiles go through the tower, the pixel shuffle and the projector in one call."""

    def __init__(self, adapter: InternVLAdapter, device: Any = "cpu", dtype: Any = None) -> None:
        from transformers import AutoConfig
        from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
            GotOcr2ImageProcessorPil,
        )
        from transformers.models.internvl import modeling_internvl as modeling

        self.adapter = adapter
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        self.hidden_size = adapter.hidden_size
        self.processor = GotOcr2ImageProcessorPil(
            **processor_kwargs(adapter.preprocessor, _PROCESSOR_KEYS), crop_to_patches=True
        )
        config = AutoConfig.from_pretrained(str(adapter.model_dir))
        self.feature_layer = int(config.vision_feature_layer)
        self.downsample_ratio = float(config.downsample_ratio)
        self.tower = modeling.InternVLVisionModel._from_config(config.vision_config)
        self.projector = modeling.InternVLMultiModalProjector(config)
        names = adapter.weight_names
        tower_prefix = find_prefix(names, "embeddings.patch_embeddings.projection.weight")
        projector_prefix = find_prefix(names, "linear_1.weight", exclude=("language_model",))
        if tower_prefix is None or projector_prefix is None:
            raise ValueError(f"no InternVL vision tower / projector weights in {adapter.model_dir}")
        scheme = adapter.quantization
        self.tower.load_state_dict(load_dense(adapter.model_dir, tower_prefix, scheme), strict=True)
        self.projector.load_state_dict(
            load_dense(adapter.model_dir, projector_prefix, scheme), strict=True
        )
        for module in (self.tower, self.projector):
            module.to(device=self.device, dtype=self.dtype).eval()
        # transformers' own pixel shuffle (it reads nothing from the model it sits on).
        self._pixel_shuffle = modeling.InternVLModel.pixel_shuffle

    def preprocess(self, image) -> PreparedImage:
        out = self.processor(images=[image], return_tensors="np")
        tiles = torch.from_numpy(np.ascontiguousarray(out["pixel_values"]))
        columns, rows = self.adapter.rule.grid(image.width, image.height)
        expected = self.adapter.rule.num_tiles(image.width, image.height)
        if tiles.shape[0] != expected or int(out["num_patches"][0]) != expected:
            raise RuntimeError(f"processor gave {tiles.shape[0]} tiles, counted {expected}")
        return PreparedImage(tiles, (rows, columns), self.adapter.image_seq_len * expected)

    @torch.inference_mode()
    def encode(self, prepared: list[PreparedImage]) -> list[torch.Tensor]:
        if not prepared:
            return []
        tiles = torch.cat([p.pixel_values for p in prepared]).to(self.device, self.dtype)
        if self.feature_layer == -1:
            features = self.tower(pixel_values=tiles).last_hidden_state
        else:
            outputs = self.tower(pixel_values=tiles, output_hidden_states=True)
            features = outputs.hidden_states[self.feature_layer]
        features = features[:, 1:, :]  # "default" strategy: the class token dropped
        side = int(features.shape[1] ** 0.5)
        features = features.reshape(features.shape[0], side, side, -1)
        features = self._pixel_shuffle(None, features, scale_factor=self.downsample_ratio)
        features = features.reshape(features.shape[0], -1, features.shape[-1])
        features = self.projector(features)  # [tiles, image_seq_len, text hidden]
        per_image = features.split([p.pixel_values.shape[0] for p in prepared])
        return [f.reshape(-1, f.shape[-1]).clone() for f in per_image]
