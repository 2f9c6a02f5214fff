"""Gemma 4 (Gemma4ForConditionalGeneration): counting and prompt expansion (no torch here).

The chat template writes `<|image|>` for an image; the processor replaces it with
`<|image>` + N × `<|image|>` + `<image|>`, N set by the image processor's resize rule
(counting.py). A video's processor writes, per frame, "mm:ss" then its own `<|image>` +
N × `<|video|>` + `<image|>`, the frames joined by spaces; Iris serves each frame as one
frame group on its own time grid (docs/design/families.md, "Gemma 4"). With
`use_bidirectional_attention` "vision" each run of soft tokens attends both ways on the
sliding layers only; such a span is never cut by a prefill chunk or a resume point. The
audio tower (the E models) is not served: neither loaded nor used.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from iris.models.base import Grid, ModelAdapter, Span
from iris.models.gemma4.counting import SoftTokenRule
from iris.models.registry import register
from iris.multimodal.video import VideoSampling

BOI_TOKEN = "<|image>"
EOI_TOKEN = "<image|>"
IMAGE_TOKEN = "<|image|>"
VIDEO_TOKEN = "<|video|>"
AUDIO_TOKEN = "<|audio|>"
# Iris's time grid for Gemma 4 (its processor takes 32 frames spread over the clip instead).
VIDEO_FPS = 1.0
# Gemma4VideoProcessor's defaults, used where video_preprocessor_config.json leaves them out.
_VIDEO_DEFAULTS = {"patch_size": 16, "pooling_kernel_size": 3, "max_soft_tokens": 70}


@register
class Gemma4Adapter(ModelAdapter):
    """An image is one span of rows × columns soft tokens; grid = (rows, columns)."""

    architectures = ("Gemma4ForConditionalGeneration",)
    text_family = "gemma4"
    _vision_markers = ("vision_tower", "embed_vision", "audio_tower", "embed_audio")

    # The token strings are the tokenizer's for the ids the config names (the tiny model's
    # are IMAGE_TOKEN and VIDEO_TOKEN).
    @cached_property
    def image_token(self) -> str:  # type: ignore[override]
        return self.tokenizer().convert_ids_to_tokens(self.image_token_id)

    @property
    def image_placeholder_text(self) -> str:  # type: ignore[override]
        return self.image_token

    @cached_property
    def video_token(self) -> str:
        return self.tokenizer().convert_ids_to_tokens(self.video_token_id)

    @property
    def video_placeholder_text(self) -> str:  # type: ignore[override]
        return self.video_token

    @property
    def bidirectional_image_spans(self) -> bool:  # type: ignore[override]
        return self.text_config.get("use_bidirectional_attention") == "vision"

    @cached_property
    def rule(self) -> SoftTokenRule:
        return SoftTokenRule.from_preprocessor(self.preprocessor)

    @property
    def max_uncut_span(self) -> int:
        """The longest span a prefill chunk must take whole: an image or a video frame at
        its budget."""
        return max(self.rule.max_soft_tokens, self.video_rule.max_soft_tokens)

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

    # -- video: one item per frame (docs/design/multimodal.md) ------------------------------

    takes_video = True
    video_time_interval = None  # plain 1D positions: the time is in the text

    @property
    def video_token_id(self) -> int:
        return int(self.config["video_token_id"])

    @cached_property
    def video_settings(self) -> dict:
        """video_preprocessor_config.json over Gemma4VideoProcessor's defaults."""
        path = self.model_dir / "video_preprocessor_config.json"
        found = json.loads(path.read_text()) if path.is_file() else {}
        return {key: found.get(key) or value for key, value in _VIDEO_DEFAULTS.items()} | {
            "fps": found.get("fps") or VIDEO_FPS
        }

    @cached_property
    def video_rule(self) -> SoftTokenRule:
        """The frames' resize rule: the image rule at the video processor's budget."""
        settings = self.video_settings
        return SoftTokenRule(
            patch_size=int(settings["patch_size"]),
            pooling_kernel_size=int(settings["pooling_kernel_size"]),
            max_soft_tokens=int(settings["max_soft_tokens"]),
        )

    @cached_property
    def video_sampling(self) -> VideoSampling:
        """Iris's grid at `fps` (1 a second unless the config sets one), one frame a group,
        every frame resized by the processor's rule at the video budget."""
        rule = self.video_rule
        return VideoSampling(
            fps=float(self.video_settings["fps"]),
            temporal_patch_size=1,
            patch_size=rule.patch_size,
            merge_size=rule.pooling_kernel_size,
            size_rule=rule,
        )

    def video_group_token_count(self, width: int, height: int) -> tuple[int, Grid]:
        """(tokens, (rows, columns)) of one frame already resized to `width` x `height`."""
        block = self.video_rule.block
        rows, columns = height // block, width // block
        return rows * columns, (rows, columns)

    def expand_video(
        self, input_ids: Sequence[int], position: int, timestamps: Sequence[float], grid: Grid
    ) -> tuple[list[int], list[Span]]:
        """The video placeholder at `position` replaced by the processor's layout: per frame
        "mm:ss " + <|image> + N × <|video|> + <image|>, frames joined by a space. Each text
        piece sits between special tokens, so it is tokenized alone. Returns the ids and
        each frame's span (inclusive), in time order."""
        if input_ids[position] != self.video_token_id:
            raise ValueError(f"no video placeholder at position {position}")
        count = int(grid[0]) * int(grid[1])
        out = list(input_ids[:position])
        spans: list[Span] = []
        for index, seconds in enumerate(timestamps):
            stamp = f"{int(seconds // 60):02d}:{int(seconds % 60):02d} "
            out.extend(self.encode_prompt(stamp if index == 0 else " " + stamp))
            spans.append(self.soft_span(out, self.video_token_id, count))
        out.extend(input_ids[position + 1 :])
        return out, spans

    def vision_runner(self, device: Any = "cpu", dtype: Any = None):
        from iris.models.gemma4.runner import Gemma4VisionRunner

        return Gemma4VisionRunner(self, device=device, dtype=dtype)
