"""Qwen3-VL / Qwen3-VL-MoE: Qwen2-VL's counting, prompt layout and M-RoPE positions, plus
deepstack levels in every embedding (no torch here)."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from iris.models.qwen2_vl.adapter import Qwen2VLAdapter
from iris.models.registry import register


@register
class Qwen3VLAdapter(Qwen2VLAdapter):
    """An image's tokens, grid and M-RoPE positions follow Qwen2-VL's rules (the same image
    processor, patch 16); the rope index is HF's `get_rope_index`, which for images equals
    Qwen2-VL's. Each embedding row holds the merger's output followed by one row of every
    deepstack level (`deepstack_levels`), so an entry is (1 + levels) x hidden wide."""

    architectures = ("Qwen3VLForConditionalGeneration",)
    text_family = "qwen3_vl"

    @cached_property
    def deepstack_levels(self) -> int:
        vision = self.config.get("vision_config") or {}
        return len(vision.get("deepstack_visual_indexes") or ())

    def vision_runner(self, device: Any = "cpu", dtype: Any = None):
        from iris.models.qwen3_vl.runner import Qwen3VisionRunner

        return Qwen3VisionRunner(self, device=device, dtype=dtype)


@register
class Qwen3VLMoeAdapter(Qwen3VLAdapter):
    """Qwen3-VL-MoE: the same vision side; its language model has sparse MoE blocks."""

    architectures = ("Qwen3VLMoeForConditionalGeneration",)
    text_family = "qwen3_vl_moe"
