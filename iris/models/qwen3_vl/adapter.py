"""Qwen3-VL / Qwen3-VL-MoE: Qwen2-VL's counting, prompt layout and M-RoPE positions, plus
deepstack levels in every embedding (no torch here)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from iris.models.base import Grid, Span
from iris.models.qwen2_vl.adapter import Qwen2VLAdapter
from iris.models.registry import register
from iris.multimodal.video import VideoSampling

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

    # -- video: one item per frame group (docs/design.md §2, "Video") ----------------------

    takes_video = True
    video_token = "<|video_pad|>"
    video_placeholder_text = "<|vision_start|><|video_pad|><|vision_end|>"

    @property
    def video_token_id(self) -> int:
        return int(self.config["video_token_id"])

    @cached_property
    def video_sampling(self) -> VideoSampling:
        """The video processor's fps, patching and `size` bounds: video_preprocessor_config.json,
        or the "video_processor" entry of processor_config.json, else its class defaults."""
        settings: dict = {}
        path = self.model_dir / "video_preprocessor_config.json"
        if path.is_file():
            settings = json.loads(path.read_text())
        elif (self.model_dir / "processor_config.json").is_file():
            processor = json.loads((self.model_dir / "processor_config.json").read_text())
            settings = processor.get("video_processor") or {}
        values = {key: settings.get(key) or default for key, default in _VIDEO_DEFAULTS.items()}
        size = settings.get("size") or _VIDEO_SIZE
        return VideoSampling(
            fps=float(values["fps"]),
            temporal_patch_size=int(values["temporal_patch_size"]),
            patch_size=int(values["patch_size"]),
            merge_size=int(values["merge_size"]),
            min_pixels=int(size["shortest_edge"]),
            max_pixels=int(size["longest_edge"]),
        )

    def video_group_token_count(self, width: int, height: int) -> tuple[int, Grid]:
        """(tokens, grid (1, h, w) in patches) of one frame group of resized frames
        `width` x `height`: the processor's get_num_of_video_patches for T frames / merge^2."""
        patch = self.video_sampling.patch_size
        grid = (1, height // patch, width // patch)
        return grid[1] * grid[2] // self.merge_size**2, grid

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
