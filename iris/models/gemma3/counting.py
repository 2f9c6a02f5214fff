"""Gemma 3: images per picture from its size alone (the processor's pan-and-scan rule).

Every image, and every pan-and-scan crop of it, is resized to the tower's square input and
becomes `mm_tokens_per_image` image tokens. Without pan-and-scan a picture is one image;
with it, a picture wide or tall enough is also cut into 2..max crops along its long side,
computed as Gemma3ImageProcessor's `pan_and_scan` computes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PanAndScanRule:
    """The processor's pan-and-scan settings (its defaults when the config leaves them null)."""

    enabled: bool = False
    min_crop_size: int = 256
    max_num_crops: int = 4
    min_ratio_to_activate: float = 1.2

    @classmethod
    def from_preprocessor(cls, preprocessor: dict) -> PanAndScanRule:
        def value(key: str, default):
            found = preprocessor.get(key)
            return default if found is None else found

        return cls(
            enabled=bool(value("do_pan_and_scan", cls.enabled)),
            min_crop_size=int(value("pan_and_scan_min_crop_size", cls.min_crop_size)),
            max_num_crops=int(value("pan_and_scan_max_num_crops", cls.max_num_crops)),
            min_ratio_to_activate=float(
                value("pan_and_scan_min_ratio_to_activate", cls.min_ratio_to_activate)
            ),
        )

    def num_crops(self, width: int, height: int) -> int:
        """Crops besides the whole image (0: none)."""
        if width < 1 or height < 1:
            raise ValueError(f"image size {width}x{height} must be at least 1x1")
        if not self.enabled:
            return 0
        long_side, short_side = (width, height) if width >= height else (height, width)
        if long_side / short_side < self.min_ratio_to_activate:
            return 0
        crops = int(math.floor(long_side / short_side + 0.5))  # half rounds up
        crops = min(int(math.floor(long_side / self.min_crop_size)), crops)
        crops = min(self.max_num_crops, max(2, crops))
        crop_long = int(math.ceil(long_side / crops))
        if min(crop_long, short_side) < self.min_crop_size:
            return 0
        return crops
