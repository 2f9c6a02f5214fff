"""Qwen3.5 and Qwen3.5-MoE with images (`Qwen3_5ForConditionalGeneration`,
`Qwen3_5MoeForConditionalGeneration`): Qwen3-VL's counting, prompt layout and M-RoPE
positions (transformers' get_rope_index for Qwen3.5 is Qwen2-VL's), without deepstack, so
an embedding row is one hidden-size row (no torch here)."""

from __future__ import annotations

from typing import Any

from iris.models.qwen3_vl.adapter import Qwen3VLAdapter
from iris.models.registry import register


@register
class Qwen3_5Adapter(Qwen3VLAdapter):
    """Qwen3-VL's image rules (the same image processor, patch 16, merge 2); the vision
    tower is Qwen3-VL's without the deepstack mergers. The language model is the hybrid
    Qwen3.5 decoder (llm_svc/engine/models/qwen3_5.py) with interleaved M-RoPE on its
    partial rotary dims."""

    architectures = ("Qwen3_5ForConditionalGeneration",)
    text_family = "qwen3_5"
    deepstack_levels = 0

    def vision_runner(self, device: Any = "cpu", dtype: Any = None):
        from iris.models.qwen3_5.runner import Qwen3_5VisionRunner

        return Qwen3_5VisionRunner(self, device=device, dtype=dtype)


@register
class Qwen3_5MoeAdapter(Qwen3_5Adapter):
    """Qwen3.5-MoE: the same vision side; its language model's MLPs are experts plus a
    gated shared expert."""

    architectures = ("Qwen3_5MoeForConditionalGeneration",)
    text_family = "qwen3_5_moe"
