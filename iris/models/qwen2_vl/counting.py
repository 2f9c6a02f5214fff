"""Qwen2-VL's image token count from the image size alone (its processor's resize rule)."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class QwenImageRule:
    """The image processor settings that decide the patch grid."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280

    @classmethod
    def from_preprocessor(cls, preprocessor: dict) -> QwenImageRule:
        """Read settings the way the HF processor does: `size` (shortest_edge/longest_edge
        are pixel counts), overridden by top-level min_pixels / max_pixels."""
        size = dict(preprocessor.get("size") or {})
        min_pixels = size.get("shortest_edge", size.get("min_pixels", cls.min_pixels))
        max_pixels = size.get("longest_edge", size.get("max_pixels", cls.max_pixels))
        if preprocessor.get("min_pixels") is not None:
            min_pixels = preprocessor["min_pixels"]
        if preprocessor.get("max_pixels") is not None:
            max_pixels = preprocessor["max_pixels"]
        return cls(
            patch_size=int(preprocessor.get("patch_size", cls.patch_size)),
            merge_size=int(preprocessor.get("merge_size", cls.merge_size)),
            temporal_patch_size=int(
                preprocessor.get("temporal_patch_size", cls.temporal_patch_size)
            ),
            min_pixels=int(min_pixels),
            max_pixels=int(max_pixels),
        )

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after the processor's smart resize: both multiples of `factor`,
        pixel count within [min_pixels, max_pixels], aspect ratio kept as well as it can."""
        if width < 1 or height < 1:
            raise ValueError(f"image size {width}x{height} must be at least 1x1")
        ratio = max(width, height) / min(width, height)
        if ratio > MAX_ASPECT_RATIO:
            raise ValueError(
                f"image aspect ratio {ratio:.1f} ({width}x{height}) is over the limit of "
                f"{MAX_ASPECT_RATIO}"
            )
        factor = self.factor
        # Python's round() (ties to even) is what the processor uses; keep it.
        h_bar = round(height / factor) * factor
        w_bar = round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt((height * width) / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return w_bar, h_bar

    def count(self, width: int, height: int) -> tuple[int, tuple[int, int, int]]:
        """(token_count, grid (t, h, w) in patches) for one image."""
        w_bar, h_bar = self.resized(width, height)
        grid = (1, h_bar // self.patch_size, w_bar // self.patch_size)
        return grid[1] * grid[2] // (self.merge_size**2), grid
