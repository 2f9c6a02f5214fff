"""Qwen3.5's vision tower and merger, loaded alone from the checkpoint: Qwen3-VL's runner
(loading, image and frame-group preprocessing) with Qwen3.5's tower class, which has no
deepstack mergers, so each image's rows are the merger's output alone."""

from __future__ import annotations

from iris.models.qwen2_vl.runner import QwenVisionRunner
from iris.models.qwen3_vl.runner import Qwen3VisionRunner


def _tower_class(model_type: str):
    if model_type == "qwen3_5_moe":
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
            Qwen3_5MoeVisionModel as Tower,
        )
    elif model_type == "qwen3_5":
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel as Tower
    else:
        raise ValueError(f"no Qwen3.5 vision tower for model_type {model_type!r}")
    return Tower


class Qwen3_5VisionRunner(Qwen3VisionRunner):
    """One tower call over a batch's patches; per image a [token_count, hidden] tensor."""

    @staticmethod
    def tower_class(model_type: str):
        return _tower_class(model_type)

    # No deepstack levels: the merged rows as Qwen2-VL's runner returns them.
    encode = QwenVisionRunner.encode
