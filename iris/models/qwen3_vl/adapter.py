"""Qwen3-VL / Qwen3-VL-MoE: Qwen2-VL's counting, prompt layout and M-RoPE positions, plus
deepstack levels in every embedding (no torch here)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from iris.models.base import Grid, Span
from iris.models.qwen2_vl.adapter import Qwen2VLAdapter
from iris.models.registry import register

# Qwen3VLVideoProcessor's defaults, used when the checkpoint has no video processor config.
_VIDEO_DEFAULTS = {"fps": 2, "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2}
_VIDEO_SIZE = {"shortest_edge": 128 * 32 * 32, "longest_edge": 768 * 32 * 32}


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

    # -- video: one item per frame group (docs/design/multimodal.md) ----------------------
    # Qwen2.5-VL's rules (Qwen2VLAdapter) with Qwen3VLVideoProcessor's defaults, a pixel
    # budget over a group's T frames, and a timestamp in the text before every group.

    takes_video = True
    video_time_interval = None  # groups are placed as images: their time is in the text
    _video_defaults = _VIDEO_DEFAULTS
    _video_size = _VIDEO_SIZE
    _video_per_frame_bounds = False

    def expand_video(
        self, input_ids: Sequence[int], position: int, timestamps: Sequence[float], grid: Grid
    ) -> tuple[list[int], list[Span]]:
        """The ids with the video placeholder at `position` (<|video_pad|>, inside its
        <|vision_start|> ... <|vision_end|> when present) replaced by the processor's layout:
        per group `<{t:.1f} seconds>` <|vision_start|> <|video_pad|> x tokens <|vision_end|>.
        Returns the new ids and each group's span (inclusive), in group order."""
        if input_ids[position] != self.video_token_id:
            raise ValueError(f"no video placeholder at position {position}")
        start_id, end_id = self.vision_start_token_id, self.vision_end_token_id
        before = position - 1 if position > 0 and input_ids[position - 1] == start_id else position
        after = position + 1
        if after < len(input_ids) and input_ids[after] == end_id:
            after += 1
        count = grid[0] * grid[1] * grid[2] // self.merge_size**2
        out = list(input_ids[:before])
        spans: list[Span] = []
        for timestamp in timestamps:
            out.extend(self.encode_prompt(f"<{timestamp:.1f} seconds>"))
            out.append(start_id)
            spans.append((len(out), len(out) + count - 1))
            out.extend([self.video_token_id] * count)
            out.append(end_id)
        out.extend(input_ids[after:])
        return out, spans

    def vision_runner(self, device: Any = "cpu", dtype: Any = None):
        from iris.models.qwen3_vl.runner import Qwen3VisionRunner

        return Qwen3VisionRunner(self, device=device, dtype=dtype)


@register
class Qwen3VLMoeAdapter(Qwen3VLAdapter):
    """Qwen3-VL-MoE: the same vision side; its language model has sparse MoE blocks."""

    architectures = ("Qwen3VLMoeForConditionalGeneration",)
    text_family = "qwen3_vl_moe"
