"""Idefics3 / SmolVLM image splitting from the image size alone (the processor's rule).

The processor resizes the longest edge to `size.longest_edge` (even sides, capped at 4096),
then up to multiples of the tile side `max_image_size.longest_edge`, and cuts that into
rows x cols tiles plus one global image when it is larger than one tile. Each tile and the
global image become `image_seq_len` <image> tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_IMAGE_SIZE = 4096


def _fit_longest_edge(height: int, width: int, longest: int) -> tuple[int, int]:
    aspect = width / height
    if width >= height:
        width = longest
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest
        width = int(height * aspect)
        width += width % 2
    return max(height, 1), max(width, 1)


def _cap(height: int, width: int, limit: int) -> tuple[int, int]:
    aspect = width / height
    if width >= height and width > limit:
        width = limit
        height = int(width / aspect)
    elif height > width and height > limit:
        height = limit
        width = int(height * aspect)
    return max(height, 1), max(width, 1)


def _to_tile_multiples(height: int, width: int, tile: int) -> tuple[int, int]:
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


@dataclass(frozen=True)
class TileRule:
    longest_edge: int = 4 * 364
    tile: int = 364
    do_resize: bool = True
    do_image_splitting: bool = True

    @classmethod
    def from_preprocessor(cls, preprocessor: dict) -> TileRule:
        size = preprocessor.get("size") or {}
        tile = preprocessor.get("max_image_size") or {}
        return cls(
            longest_edge=int(size.get("longest_edge", cls.longest_edge)),
            tile=int(tile.get("longest_edge", cls.tile)),
            do_resize=bool(preprocessor.get("do_resize", True)),
            do_image_splitting=bool(preprocessor.get("do_image_splitting", True)),
        )

    def rows_cols(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of tiles; (0, 0) when the image is one global image only."""
        if width < 1 or height < 1:
            raise ValueError(f"image size {width}x{height} must be at least 1x1")
        if not self.do_image_splitting:
            return 0, 0
        if self.do_resize:
            height, width = _fit_longest_edge(height, width, self.longest_edge)
            height, width = _cap(height, width, MAX_IMAGE_SIZE)
        height, width = _to_tile_multiples(height, width, self.tile)
        if height > self.tile or width > self.tile:
            return height // self.tile, width // self.tile
        return 0, 0
