"""Idefics3 / SmolVLM: tile counting and prompt expansion (no torch here)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from iris.models.base import Grid, ModelAdapter, Span
from iris.models.checkpoint import read_json
from iris.models.idefics3.counting import TileRule
from iris.models.registry import register

FAKE_TOKEN = "<fake_token_around_image>"
GLOBAL_TOKEN = "<global-img>"


@register
class Idefics3Adapter(ModelAdapter):
    """An image is rows x cols tiles plus a global image, each `image_seq_len` <image>
    tokens; grid = (rows, cols), (0, 0) for an unsplit image."""

    architectures = ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration")
    text_family = "llama"
    image_token = "<image>"
    image_placeholder_text = "<image>"
    _vision_markers = ("vision_model", "connector")

    @cached_property
    def rule(self) -> TileRule:
        return TileRule.from_preprocessor(self.preprocessor)

    @cached_property
    def image_seq_len(self) -> int:
        """<image> tokens per tile: (image_size / patch_size)^2 / scale_factor^2."""
        vision = self.config["vision_config"]
        side = int(vision["image_size"]) // int(vision["patch_size"])
        seq_len = side * side // int(self.config.get("scale_factor", 2)) ** 2
        declared = (read_json(self.model_dir / "processor_config.json") or {}).get("image_seq_len")
        if declared is not None and int(declared) != seq_len:
            raise ValueError(
                f"processor_config.json image_seq_len={declared} but the vision config gives "
                f"{seq_len}"
            )
        return seq_len

    def image_token_count(self, width: int, height: int) -> tuple[int, Grid]:
        rows, cols = self.rule.rows_cols(width, height)
        return self.image_seq_len * (rows * cols + 1), (rows, cols)

    @cached_property
    def _piece_ids(self) -> dict[str, list[int]]:
        tokenizer = self.tokenizer()

        def ids(text: str) -> list[int]:
            return tokenizer(text, add_special_tokens=False)["input_ids"]

        return {"\n": ids("\n"), "\n\n": ids("\n\n")}

    def _token_id(self, token: str) -> int:
        return self.tokenizer().convert_tokens_to_ids(token)

    def _expansion(self, grid: Grid, base: int) -> tuple[list[int], list[Span]]:
        """The ids one image expands to (HF's text layout, tokenized piecewise: every piece
        sits between special tokens, so it tokenizes alone) and its spans from `base`."""
        if len(grid) != 2 or any(int(x) < 0 for x in grid) or (grid[0] == 0) != (grid[1] == 0):
            raise ValueError(
                f"Idefics3 grid must be (rows, cols), both 0 or both > 0, got {grid!r}"
            )
        rows, cols = int(grid[0]), int(grid[1])
        fake, image = self._token_id(FAKE_TOKEN), self.image_token_id
        seq_len = self.image_seq_len
        ids: list[int] = []
        spans: list[Span] = []

        def tile(tag_id: int) -> None:
            ids.extend((fake, tag_id))
            spans.append((base + len(ids), base + len(ids) + seq_len - 1))
            ids.extend([image] * seq_len)

        for row in range(rows):
            for col in range(cols):
                tile(self._token_id(f"<row_{row + 1}_col_{col + 1}>"))
            # Rows end with "\n"; the last row's "\n" meets the global image's leading "\n".
            ids.extend(self._piece_ids["\n\n" if row == rows - 1 else "\n"])
        tile(self._token_id(GLOBAL_TOKEN))
        ids.append(fake)
        return ids, spans

    def expand_prompt(
        self, input_ids: Sequence[int], grids: Sequence[Grid]
    ) -> tuple[list[int], list[list[Span]]]:
        positions = self._placeholder_positions(input_ids, grids)
        out: list[int] = []
        spans: list[list[Span]] = []
        cursor = 0
        for position, grid in zip(positions, grids, strict=True):
            out.extend(input_ids[cursor:position])
            ids, image_spans = self._expansion(tuple(grid), len(out))
            out.extend(ids)
            spans.append(image_spans)
            cursor = position + 1
        out.extend(input_ids[cursor:])
        return out, spans

    def vision_runner(self, device: Any = "cpu", dtype: Any = None):
        from iris.models.idefics3.runner import IdeficsVisionRunner

        return IdeficsVisionRunner(self, device=device, dtype=dtype)
