"""InternVL's dynamic tiling from the image size alone (GotOcr2's rule, as InternVLProcessor
runs it: `crop_to_patches` on).

Among every grid of c x r tiles with min_patches <= c*r <= max_patches (ordered by tile
count, stable), the one whose aspect ratio c/r is nearest the image's wins; on an exact tie
of that distance a later (larger) grid replaces it while the image's area exceeds half the
grid's area in pixels. A grid of more than one tile adds a thumbnail (the whole image at
one tile's size). Each tile and the thumbnail become `image_seq_length` context tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@lru_cache(maxsize=16)
def tile_grids(min_tiles: int, max_tiles: int) -> tuple[tuple[int, int], ...]:
    """Every (columns, rows) with min_tiles <= columns*rows <= max_tiles, ordered by tile
    count; grids of one count keep their (columns, rows) lexical order (a stable sort)."""
    grids = [
        (columns, rows)
        for columns in range(1, max_tiles + 1)
        for rows in range(1, max_tiles + 1)
        if min_tiles <= columns * rows <= max_tiles
    ]
    return tuple(sorted(grids, key=lambda grid: grid[0] * grid[1]))


@dataclass(frozen=True)
class TilingRule:
    """The image processor's tiling settings (preprocessor_config.json)."""

    tile_height: int = 448
    tile_width: int = 448
    min_patches: int = 1
    max_patches: int = 12
    # InternVLProcessor passes crop_to_patches=True whatever the image processor's default.
    crop_to_patches: bool = True

    @classmethod
    def from_preprocessor(cls, preprocessor: dict) -> TilingRule:
        size = preprocessor.get("size") or {}
        return cls(
            tile_height=int(size.get("height", cls.tile_height)),
            tile_width=int(size.get("width", cls.tile_width)),
            min_patches=int(preprocessor.get("min_patches", cls.min_patches)),
            max_patches=int(preprocessor.get("max_patches", cls.max_patches)),
        )

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(columns, rows) of tiles the image is resized to and cut into."""
        if width < 1 or height < 1:
            raise ValueError(f"image size {width}x{height} must be at least 1x1")
        if not self.crop_to_patches or self.max_patches <= 1:
            return 1, 1
        aspect = width / height
        area = width * height
        best, best_diff = (1, 1), float("inf")
        for columns, rows in tile_grids(self.min_patches, self.max_patches):
            diff = abs(aspect - columns / rows)
            if diff < best_diff:
                best, best_diff = (columns, rows), diff
            elif diff == best_diff:
                tiles_area = self.tile_height * self.tile_width * columns * rows
                if area > 0.5 * tiles_area:
                    best = (columns, rows)
        return best

    def num_tiles(self, width: int, height: int) -> int:
        """Tiles the vision tower sees: columns*rows, plus the thumbnail when that is > 1."""
        columns, rows = self.grid(width, height)
        return 1 if columns * rows == 1 else columns * rows + 1
