"""Gemma 4 (Gemma4ForConditionalGeneration): counting and prompt expansion (no torch here).

The chat template writes `<|image|>` for an image; the processor replaces it with
`<|image>` + N × `<|image|>` + `<image|>`, N set by the image processor's resize rule
(counting.py). A video is up to 32 frames, each "mm:ss" then its own `<|image>` +
N × `<|video|>` + `<image|>`, joined by spaces (video_layout.py). With
`use_bidirectional_attention` "vision" each run of soft tokens attends both ways on the
sliding layers only; such a span is never cut by a prefill chunk or a resume point. The
audio tower (the E models) is not served: neither loaded nor used.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from iris.models.base import Grid, ModelAdapter, Span
from iris.models.gemma4.counting import SoftTokenRule
from iris.models.registry import register

BOI_TOKEN = "<|image>"
EOI_TOKEN = "<image|>"
IMAGE_TOKEN = "<|image|>"
VIDEO_TOKEN = "<|video|>"
AUDIO_TOKEN = "<|audio|>"


@register
class Gemma4Adapter(ModelAdapter):
    """An image is one span of rows × columns soft tokens; grid = (rows, columns)."""

    architectures = ("Gemma4ForConditionalGeneration",)
    text_family = "gemma4"
    image_token = IMAGE_TOKEN
    image_placeholder_text = IMAGE_TOKEN
    _vision_markers = ("vision_tower", "embed_vision", "audio_tower", "embed_audio")

    @property
    def bidirectional_image_spans(self) -> bool:  # type: ignore[override]
        return self.text_config.get("use_bidirectional_attention") == "vision"

    @cached_property
    def rule(self) -> SoftTokenRule:
        return SoftTokenRule.from_preprocessor(self.preprocessor)

    @property
    def max_uncut_span(self) -> int:
        """The longest span a prefill chunk must take whole: one image at the budget."""
        return self.rule.max_soft_tokens

    def image_token_count(self, width: int, height: int) -> tuple[int, Grid]:
        rows, columns = self.rule.grid(width, height)
        return rows * columns, (rows, columns)

    @cached_property
    def marker_ids(self) -> tuple[int, int]:
        """(boi, eoi) ids, as the config names them."""
        tokenizer = self.tokenizer()
        boi = self.config.get("boi_token_id", tokenizer.convert_tokens_to_ids(BOI_TOKEN))
        eoi = self.config.get("eoi_token_id", tokenizer.convert_tokens_to_ids(EOI_TOKEN))
        return int(boi), int(eoi)

    def soft_span(self, out: list[int], token: int, count: int) -> Span:
        """Append boi + `count` × `token` + eoi to `out`; the soft tokens' span."""
        boi, eoi = self.marker_ids
        out.append(boi)
        span = (len(out), len(out) + count - 1)
        out.extend([token] * count)
        out.append(eoi)
        return span

    def expand_prompt(
        self, input_ids: Sequence[int], grids: Sequence[Grid]
    ) -> tuple[list[int], list[list[Span]]]:
        positions = self._placeholder_positions(input_ids, grids)
        out: list[int] = []
        spans: list[list[Span]] = []
        cursor = 0
        for position, grid in zip(positions, grids, strict=True):
            if len(grid) != 2 or min(int(side) for side in grid) < 1:
                raise ValueError(f"Gemma 4 grid must be (rows, columns) >= 1, got {grid!r}")
            out.extend(input_ids[cursor:position])
            spans.append([self.soft_span(out, self.image_token_id, int(grid[0]) * int(grid[1]))])
            cursor = position + 1
        out.extend(input_ids[cursor:])
        return out, spans

    def vision_runner(self, device: Any = "cpu", dtype: Any = None):
        from iris.models.gemma4.runner import Gemma4VisionRunner

        return Gemma4VisionRunner(self, device=device, dtype=dtype)
