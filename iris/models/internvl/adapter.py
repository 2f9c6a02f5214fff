"""InternVL3 / InternVL3.5 (the transformers "-HF" layout): dynamic tiling, prompt
expansion and the language model's family (no torch here)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from iris.models.base import Grid, ModelAdapter, Span
from iris.models.internvl.counting import TilingRule
from iris.models.registry import UnsupportedModelError, register

START_IMAGE = "<img>"
END_IMAGE = "</img>"
# The language models InternVL checkpoints ship with, by text_config.model_type.
_TEXT_FAMILIES = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "llama": "llama"}


def refuse_vision_options(architecture: str, config: dict) -> None:
    """UnsupportedModelError for the projector options Iris does not run: a list-valued
    `vision_feature_layer` (features concatenated from several layers)."""
    layer = config.get("vision_feature_layer", -1)
    if not isinstance(layer, int):
        raise UnsupportedModelError(
            f"{architecture}: vision_feature_layer={layer!r} (a list of layers) is not "
            "supported; one layer index is"
        )


@register
class InternVLAdapter(ModelAdapter):
    """An image is `<img>` + image_seq_length x `<IMG_CONTEXT>` per tile + `</img>`: one
    span of seq_len * tiles rows, tiles = columns * rows (+ 1 thumbnail when > 1);
    grid = (rows, columns)."""

    architectures = ("InternVLForConditionalGeneration",)
    text_family = "qwen3"
    image_token = "<IMG_CONTEXT>"
    image_placeholder_text = "<IMG_CONTEXT>"
    _vision_markers = ("vision_tower", "multi_modal_projector")

    @classmethod
    def text_family_of(cls, config: dict) -> str:
        architecture = cls.architectures[0]
        refuse_vision_options(architecture, config)
        strategy = config.get("vision_feature_select_strategy", "default")
        if strategy != "default":
            raise UnsupportedModelError(
                f"{architecture}: vision_feature_select_strategy={strategy!r} is not "
                "supported (only 'default', which drops the class token)"
            )
        model_type = (config.get("text_config") or {}).get("model_type", "qwen2")
        if model_type == "gpt_oss":
            raise UnsupportedModelError(
                f"{architecture} with a GPT-OSS language model (text_config.model_type "
                "'gpt_oss') is not supported"
            )
        try:
            return _TEXT_FAMILIES[model_type]
        except KeyError:
            raise UnsupportedModelError(
                f"{architecture}: language model {model_type!r} is not supported "
                f"(supported: {', '.join(sorted(_TEXT_FAMILIES))})"
            ) from None

    @cached_property
    def rule(self) -> TilingRule:
        return TilingRule.from_preprocessor(self.preprocessor)

    @cached_property
    def image_seq_len(self) -> int:
        """Context tokens per tile: (image_size / patch_size)^2 * downsample_ratio^2."""
        vision = self.config["vision_config"]
        size, patch = _pair(vision.get("image_size", 448)), _pair(vision.get("patch_size", 14))
        ratio = float(self.config.get("downsample_ratio", 0.5))
        seq_len = round((size[0] // patch[0]) * (size[1] // patch[1]) * ratio * ratio)
        declared = self.config.get("image_seq_length")
        if declared is not None and int(declared) != seq_len:
            raise ValueError(
                f"config.json image_seq_length={declared} but the vision config gives {seq_len}"
            )
        return seq_len

    def image_token_count(self, width: int, height: int) -> tuple[int, Grid]:
        columns, rows = self.rule.grid(width, height)
        return self.image_seq_len * self.rule.num_tiles(width, height), (rows, columns)

    def _tiles(self, grid: Grid) -> int:
        if len(grid) != 2 or any(int(x) < 1 for x in grid):
            raise ValueError(
                f"InternVL grid must be (rows, columns) of positive ints, got {grid!r}"
            )
        tiles = int(grid[0]) * int(grid[1])
        return 1 if tiles == 1 else tiles + 1

    def expand_prompt(
        self, input_ids: Sequence[int], grids: Sequence[Grid]
    ) -> tuple[list[int], list[list[Span]]]:
        positions = self._placeholder_positions(input_ids, grids)
        tokenizer = self.tokenizer()
        start = tokenizer.convert_tokens_to_ids(START_IMAGE)
        end = tokenizer.convert_tokens_to_ids(END_IMAGE)
        out: list[int] = []
        spans: list[list[Span]] = []
        cursor = 0
        for position, grid in zip(positions, grids, strict=True):
            out.extend(input_ids[cursor:position])
            count = self.image_seq_len * self._tiles(tuple(grid))
            out.append(start)
            spans.append([(len(out), len(out) + count - 1)])
            out.extend([self.image_token_id] * count)
            out.append(end)
            cursor = position + 1
        out.extend(input_ids[cursor:])
        return out, spans

    def vision_runner(self, device: Any = "cpu", dtype: Any = None):
        from iris.models.internvl.runner import InternVLVisionRunner

        return InternVLVisionRunner(self, device=device, dtype=dtype)


def _pair(value) -> tuple[int, int]:
    return (int(value[0]), int(value[1])) if isinstance(value, list | tuple) else (value, value)
