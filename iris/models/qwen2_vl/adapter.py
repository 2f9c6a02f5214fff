"""Qwen2-VL / Qwen2.5-VL: counting, prompt expansion, M-RoPE (no torch here)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from iris.models.base import Grid, ModelAdapter, Span
from iris.models.qwen2_vl.counting import QwenImageRule
from iris.models.qwen2_vl.mrope import mrope_positions
from iris.models.registry import register


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
        return mrope_positions(input_ids_len, items, self.merge_size)

    def vision_runner(self, device: Any = "cpu", dtype: Any = None):
        from iris.models.qwen2_vl.runner import QwenVisionRunner

        return QwenVisionRunner(self, device=device, dtype=dtype)


def _grid_tokens(grid: Grid, merge_size: int) -> int:
    if len(grid) != 3 or any(int(x) < 1 for x in grid):
        raise ValueError(f"Qwen2-VL grid must be (t, h, w) of positive ints, got {grid!r}")
    t, h, w = (int(x) for x in grid)
    return t * h * w // merge_size**2
