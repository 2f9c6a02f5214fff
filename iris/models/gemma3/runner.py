"""Gemma 3's SigLIP tower + multimodal projector, loaded alone from the checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from iris.models.checkpoint import find_prefix
from iris.models.fp8 import load_dense
from iris.models.runner import PreparedImage, VisionRunner, processor_kwargs

if TYPE_CHECKING:
    from iris.models.gemma3.adapter import Gemma3Adapter

# The image-processor settings of this family, beside the common ones.
_PROCESSOR_KEYS = (
    "size",
    "do_resize",
    "do_pan_and_scan",
    "pan_and_scan_min_crop_size",
    "pan_and_scan_max_num_crops",
    "pan_and_scan_min_ratio_to_activate",
)


class Gemma3VisionRunner(VisionRunner):
    """Pictures (the image, then its pan-and-scan crops) from Gemma3ImageProcessorPil, each
    the tower's square input: a whole batch goes through the tower and projector at once,
    which pools every picture to `mm_tokens_per_image` rows (HF's get_image_features)."""

    def __init__(self, adapter: Gemma3Adapter, device: Any = "cpu", dtype: Any = None) -> None:
        from transformers import AutoConfig
        from transformers.models.gemma3.image_processing_pil_gemma3 import (
            Gemma3ImageProcessorPil,
        )
        from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector
        from transformers.models.siglip.modeling_siglip import SiglipVisionModel

        self.adapter = adapter
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        self.hidden_size = adapter.hidden_size
        kwargs = processor_kwargs(adapter.preprocessor, _PROCESSOR_KEYS)
        self.processor = Gemma3ImageProcessorPil(
            **{key: value for key, value in kwargs.items() if value is not None}
        )
        config = AutoConfig.from_pretrained(str(adapter.model_dir))
        self.tower = SiglipVisionModel._from_config(config.vision_config)
        self.projector = Gemma3MultiModalProjector(config)
        names = adapter.weight_names
        tower_prefix = find_prefix(names, "embeddings.patch_embedding.weight")
        projector_prefix = find_prefix(names, "mm_input_projection_weight")
        if tower_prefix is None or projector_prefix is None:
            raise ValueError(f"no Gemma 3 vision tower / projector weights in {adapter.model_dir}")
        # FP8 layers of an FP8 checkpoint are dequantized here, once (iris/models/fp8.py).
        scheme = adapter.quantization
        # Published checkpoints name the tower's tensors under `vision_model.`, which
        # transformers 5's tower (and its saved checkpoints) no longer has: the prefix found
        # above already ends with it when present, so both layouts load.
        tensors = load_dense(adapter.model_dir, tower_prefix, scheme)
        self.tower.load_state_dict(tensors, strict=True)
        self.projector.load_state_dict(
            load_dense(adapter.model_dir, projector_prefix, scheme), strict=True
        )
        for module in (self.tower, self.projector):
            module.to(device=self.device, dtype=self.dtype).eval()

    def preprocess(self, image) -> PreparedImage:
        out = self.processor(images=[image], return_tensors="np")
        crops = int(np.asarray(out["num_crops"]).reshape(-1)[0])
        pictures = torch.from_numpy(np.ascontiguousarray(out["pixel_values"]))
        if pictures.shape[0] != 1 + crops:
            raise RuntimeError(f"processor gave {pictures.shape[0]} pictures for {crops} crops")
        token_count = self.adapter.tokens_per_image * (1 + crops)
        return PreparedImage(pictures, (crops,), token_count)

    @torch.inference_mode()
    def encode(self, prepared: list[PreparedImage]) -> list[torch.Tensor]:
        if not prepared:
            return []
        pictures = torch.cat([p.pixel_values for p in prepared]).to(self.device, self.dtype)
        hidden = self.tower(pixel_values=pictures).last_hidden_state
        features = self.projector(hidden)  # [pictures, mm_tokens_per_image, text hidden]
        per_image = features.split([p.pixel_values.shape[0] for p in prepared])
        return [f.reshape(-1, f.shape[-1]).clone() for f in per_image]
