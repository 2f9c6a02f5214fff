"""Mistral 3 (Pixtral) image size from the header alone: the processor's resize rule.

An image larger than `longest_edge` on either side is scaled down (floor of each side over
the larger ratio); each side is then rounded up to a multiple of patch_size x
spatial_merge_size. The image is rows x cols merged tokens of that block size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PixtralRule:
    longest_edge: int = 1540
    block: int = 28  # patch_size * spatial_merge_size

    def rows_cols(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of merged tokens."""
        if width < 1 or height < 1:
            raise ValueError(f"image size {width}x{height} must be at least 1x1")
        ratio = max(height / self.longest_edge, width / self.longest_edge)
        if ratio > 1:
            height, width = int(math.floor(height / ratio)), int(math.floor(width / ratio))
        return (height - 1) // self.block + 1, (width - 1) // self.block + 1
