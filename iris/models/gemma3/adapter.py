"""Gemma 3 (Gemma3ForConditionalGeneration): counting and prompt expansion (no torch here).

The chat template marks an image with `<start_of_image>`; the processor replaces it with
"\\n\\n<start_of_image>" + `mm_tokens_per_image` × `<image_soft_token>` + "<end_of_image>\\n\\n",
and with pan-and-scan crops "Here is the original image {that} and here are some crops to
help you see better {that} {that} ...". Each run of soft tokens is one span; the language
model attends bidirectionally inside it during prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from iris.models.base import Grid, ModelAdapter, Span
from iris.models.gemma3.counting import PanAndScanRule
from iris.models.registry import register

BOI_TOKEN = "<start_of_image>"
EOI_TOKEN = "<end_of_image>"
IMAGE_TOKEN = "<image_soft_token>"
CROPS_INTRO = "Here is the original image "
CROPS_BRIDGE = " and here are some crops to help you see better "


@register
class Gemma3Adapter(ModelAdapter):
    """An image is 1 + crops pictures of `mm_tokens_per_image` tokens each; grid = (crops,)."""

    architectures = ("Gemma3ForConditionalGeneration",)
    text_family = "gemma3"
    image_token = IMAGE_TOKEN
    image_placeholder_text = BOI_TOKEN
    placeholder_token = BOI_TOKEN
    bidirectional_image_spans = True
    _vision_markers = ("vision_tower", "multi_modal_projector")

    @cached_property
    def rule(self) -> PanAndScanRule:
        return PanAndScanRule.from_preprocessor(self.preprocessor)

    @property
    def tokens_per_image(self) -> int:
        return int(self.config.get("mm_tokens_per_image", 256))

    @property
    def max_uncut_span(self) -> int:
        """The longest span a prefill chunk must take whole."""
        return self.tokens_per_image

    def image_token_count(self, width: int, height: int) -> tuple[int, Grid]:
        crops = self.rule.num_crops(width, height)
        return self.tokens_per_image * (1 + crops), (crops,)

    @cached_property
    def _piece_ids(self) -> dict[str, list[int]]:
        tokenizer = self.tokenizer()

        def ids(text: str) -> list[int]:
            return tokenizer(text, add_special_tokens=False)["input_ids"]

        pieces = ("\n\n", CROPS_INTRO, CROPS_BRIDGE, " ")
        marks = {"boi": BOI_TOKEN, "eoi": EOI_TOKEN}
        found = {name: ids(text) for name, text in zip(pieces, pieces, strict=True)}
        found.update({name: [tokenizer.convert_tokens_to_ids(t)] for name, t in marks.items()})
        return found

    def _picture(self, ids: list[int], spans: list[Span], base: int) -> None:
        """One picture's "\\n\\n<boi> soft tokens <eoi>\\n\\n", appended to `ids`."""
        pieces = self._piece_ids
        count = self.tokens_per_image
        ids.extend(pieces["\n\n"] + pieces["boi"])
        spans.append((base + len(ids), base + len(ids) + count - 1))
        ids.extend([self.image_token_id] * count)
        ids.extend(pieces["eoi"] + pieces["\n\n"])

    def _expansion(self, grid: Grid, base: int) -> tuple[list[int], list[Span]]:
        """The ids one image expands to and its spans from `base`. Each piece sits between
        special tokens or newlines, so it is tokenized alone (see docs/design/families.md on
        newlines that touch the placeholder)."""
        if len(grid) != 1 or int(grid[0]) < 0:
            raise ValueError(f"Gemma 3 grid must be (crops,) with crops >= 0, got {grid!r}")
        crops = int(grid[0])
        ids: list[int] = []
        spans: list[Span] = []
        if crops:
            ids.extend(self._piece_ids[CROPS_INTRO])
        self._picture(ids, spans, base)
        if crops:
            ids.extend(self._piece_ids[CROPS_BRIDGE])
            for index in range(crops):
                if index:
                    ids.extend(self._piece_ids[" "])
                self._picture(ids, spans, base)
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
        from iris.models.gemma3.runner import Gemma3VisionRunner

        return Gemma3VisionRunner(self, device=device, dtype=dtype)
