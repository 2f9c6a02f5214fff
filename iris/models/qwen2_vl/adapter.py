"""Qwen2-VL / Qwen2.5-VL: counting, prompt expansion, M-RoPE (no torch here)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from iris.models.base import Grid, ModelAdapter, Span
from iris.models.qwen2_vl.counting import QwenImageRule
from iris.models.qwen2_vl.mrope import mrope_positions
from iris.models.registry import register
from iris.multimodal.video import VideoSampling

# Qwen2VLVideoProcessor's defaults (Qwen2.5-VL's video processor), used when the checkpoint
# has no video processor config; fps is the Qwen2.5-VL processor's sampling rate.
_VIDEO_DEFAULTS = {"fps": 2, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}
_VIDEO_SIZE = {"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28}


@register
class Qwen2VLAdapter(ModelAdapter):
    """Images are `<|vision_start|>` + token_count x `<|image_pad|>` + `<|vision_end|>`;
    token_count = (h/patch * w/patch) / merge^2 after the smart resize; grid = (t, h, w)."""

    architectures = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")
    text_family = "qwen2"
    image_token = "<|image_pad|>"
    image_placeholder_text = "<|vision_start|><|image_pad|><|vision_end|>"
    uses_mrope = True

    @cached_property
    def rule(self) -> QwenImageRule:
        return QwenImageRule.from_preprocessor(self.preprocessor)

    @property
    def merge_size(self) -> int:
        vision = self.config.get("vision_config") or {}
        return int(vision.get("spatial_merge_size", self.rule.merge_size))

    @property
    def vision_start_token_id(self) -> int:
        return int(self.config["vision_start_token_id"])

    @property
    def vision_end_token_id(self) -> int:
        return int(self.config["vision_end_token_id"])

    def image_token_count(self, width: int, height: int) -> tuple[int, Grid]:
        return self.rule.count(width, height)

    def expand_prompt(
        self, input_ids: Sequence[int], grids: Sequence[Grid]
    ) -> tuple[list[int], list[list[Span]]]:
        positions = self._placeholder_positions(input_ids, grids)
        start_id, end_id = self.vision_start_token_id, self.vision_end_token_id
        out: list[int] = []
        spans: list[list[Span]] = []
        cursor = 0
        for position, grid in zip(positions, grids, strict=True):
            out.extend(input_ids[cursor:position])
            # A bare <|image_pad|> (no start/end around it) still gets the full expansion.
            if position == 0 or input_ids[position - 1] != start_id:
                out.append(start_id)
            count = _grid_tokens(grid, self.merge_size)
            spans.append([(len(out), len(out) + count - 1)])
            out.extend([self.image_token_id] * count)
            cursor = position + 1
            if cursor >= len(input_ids) or input_ids[cursor] != end_id:
                out.append(end_id)
        out.extend(input_ids[cursor:])
        return out, spans

    def mrope_positions(self, input_ids_len: int, items: Sequence[Any]):
        """(positions [3, N] int64 numpy array, delta) from items' offsets and grids; equal to
        HF's get_rope_index for the same prompt. Decoded token i (i >= N) sits at i + delta."""
        return mrope_positions(input_ids_len, items, self.merge_size, self.video_time_interval)

    # -- video: one item per frame group (docs/design/multimodal.md) ----------------------
    # Qwen2.5-VL: a video is one <|vision_start|> ... <|vision_end|> holding every group's
    # tokens, and a group's temporal M-RoPE position is its absolute time (group index x
    # second_per_grid_t x tokens_per_second). Qwen2-VL takes no video here.

    video_token = "<|video_pad|>"
    video_placeholder_text = "<|vision_start|><|video_pad|><|vision_end|>"
    _video_defaults = _VIDEO_DEFAULTS
    _video_size = _VIDEO_SIZE
    _video_per_frame_bounds = True

    @property
    def takes_video(self) -> bool:
        return self.config.get("model_type") == "qwen2_5_vl"

    @property
    def video_token_id(self) -> int:
        return int(self.config["video_token_id"])

    @cached_property
    def video_time_interval(self) -> float | None:
        """Temporal M-RoPE positions per group: tokens_per_second x temporal_patch_size /
        fps (HF's time_interval with the processor's second_per_grid_ts); None when groups
        are placed as images (Qwen3-VL: the time is in the text)."""
        if not self.takes_video:
            return None
        vision = self.config.get("vision_config") or {}
        sampling = self.video_sampling
        tokens_per_second = float(vision.get("tokens_per_second", 2))
        return tokens_per_second * (sampling.temporal_patch_size / sampling.fps)

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
        defaults = self._video_defaults
        values = {key: settings.get(key) or default for key, default in defaults.items()}
        size = dict(settings.get("size") or self._video_size)
        if settings.get("min_pixels"):
            size["shortest_edge"] = settings["min_pixels"]
        if settings.get("max_pixels"):
            size["longest_edge"] = settings["max_pixels"]
        return VideoSampling(
            fps=float(values["fps"]),
            temporal_patch_size=int(values["temporal_patch_size"]),
            patch_size=int(values["patch_size"]),
            merge_size=int(values["merge_size"]),
            min_pixels=int(size["shortest_edge"]),
            max_pixels=int(size["longest_edge"]),
            per_frame_bounds=self._video_per_frame_bounds,
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
        """Qwen2.5-VL's layout: the video placeholder at `position` becomes <|vision_start|>
        + every group's <|video_pad|> tokens + <|vision_end|> (no timestamps). Returns the
        ids and each group's span (inclusive), in group order."""
        if input_ids[position] != self.video_token_id:
            raise ValueError(f"no video placeholder at position {position}")
        start_id, end_id = self.vision_start_token_id, self.vision_end_token_id
        before = position - 1 if position > 0 and input_ids[position - 1] == start_id else position
        after = position + 1
        if after < len(input_ids) and input_ids[after] == end_id:
            after += 1
        count = _grid_tokens(grid, self.merge_size)
        out = [*input_ids[:before], start_id]
        spans: list[Span] = []
        for _ in timestamps:
            spans.append((len(out), len(out) + count - 1))
            out.extend([self.video_token_id] * count)
        out.append(end_id)
        out.extend(input_ids[after:])
        return out, spans

    def vision_runner(self, device: Any = "cpu", dtype: Any = None):
        from iris.models.qwen2_vl.runner import QwenVisionRunner

        return QwenVisionRunner(self, device=device, dtype=dtype)


def _grid_tokens(grid: Grid, merge_size: int) -> int:
    if len(grid) != 3 or any(int(x) < 1 for x in grid):
        raise ValueError(f"Qwen2-VL grid must be (t, h, w) of positive ints, got {grid!r}")
    t, h, w = (int(x) for x in grid)
    return t * h * w // merge_size**2
