"""Mistral Small 3.x (`Mistral3ForConditionalGeneration`, a `mistral` text config):
counting, and the expansion into rows broken by [IMG_BREAK] (no torch here)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from iris.models.base import Grid, ModelAdapter, Span
from iris.models.internvl.adapter import refuse_vision_options
from iris.models.mistral3.counting import PixtralRule
from iris.models.registry import UnsupportedModelError, register
from iris.models.tool_format import MISTRAL

IMAGE_BREAK = "[IMG_BREAK]"
IMAGE_END = "[IMG_END]"


@register
class Mistral3Adapter(ModelAdapter):
    """An image is rows of cols `[IMG]` tokens, each row followed by `[IMG_BREAK]` but the
    last, which ends with `[IMG_END]`: one span per row (the breaks are text), rows*cols
    embedding rows in row-major order; grid = (rows, cols). Tool calls are Mistral's
    `[TOOL_CALLS][{...}, ...]` (iris.models.tool_format.MISTRAL)."""

    architectures = ("Mistral3ForConditionalGeneration",)
    text_family = "llama"
    image_token = "[IMG]"
    image_placeholder_text = "[IMG]"
    _vision_markers = ("vision_tower", "multi_modal_projector")
    tool_call_format = MISTRAL

    @classmethod
    def text_family_of(cls, config: dict) -> str:
        architecture = cls.architectures[0]
        refuse_vision_options(architecture, config)
        model_type = (config.get("text_config") or {}).get("model_type", "mistral")
        if model_type == "ministral3":
            raise UnsupportedModelError(
                f"{architecture} with a 'ministral3' text config (YaRN rope, "
                "llama_4_scaling_beta) is not supported; a 'mistral' text config is"
            )
        if model_type != "mistral":
            raise UnsupportedModelError(
                f"{architecture}: language model {model_type!r} is not supported "
                "(supported: mistral)"
            )
        return "llama"

    @cached_property
    def rule(self) -> PixtralRule:
        vision = self.config.get("vision_config") or {}
        merge = int(self.config.get("spatial_merge_size", 2))
        size = self.preprocessor.get("size") or {}
        return PixtralRule(
            longest_edge=int(size.get("longest_edge", vision.get("image_size", 1540))),
            block=int(vision.get("patch_size", 14)) * merge,
        )

    def image_token_count(self, width: int, height: int) -> tuple[int, Grid]:
        rows, cols = self.rule.rows_cols(width, height)
        return rows * cols, (rows, cols)

    def expand_prompt(
        self, input_ids: Sequence[int], grids: Sequence[Grid]
    ) -> tuple[list[int], list[list[Span]]]:
        positions = self._placeholder_positions(input_ids, grids)
        tokenizer = self.tokenizer()
        brk = tokenizer.convert_tokens_to_ids(IMAGE_BREAK)
        end = tokenizer.convert_tokens_to_ids(IMAGE_END)
        out: list[int] = []
        spans: list[list[Span]] = []
        cursor = 0
        for position, grid in zip(positions, grids, strict=True):
            if len(grid) != 2 or any(int(x) < 1 for x in grid):
                raise ValueError(f"Mistral 3 grid must be (rows, cols) > 0, got {grid!r}")
            rows, cols = int(grid[0]), int(grid[1])
            out.extend(input_ids[cursor:position])
            image_spans: list[Span] = []
            for row in range(rows):
                image_spans.append((len(out), len(out) + cols - 1))
                out.extend([self.image_token_id] * cols)
                out.append(end if row == rows - 1 else brk)
            spans.append(image_spans)
            cursor = position + 1
        out.extend(input_ids[cursor:])
        return out, spans

    def vision_runner(self, device: Any = "cpu", dtype: Any = None):
        from iris.models.mistral3.runner import Mistral3VisionRunner

        return Mistral3VisionRunner(self, device=device, dtype=dtype)
