"""Gemma 4: soft tokens per image from its size alone (the image processor's resize rule).

Gemma4ImageProcessor resizes an image, keeping its aspect ratio, to the largest size whose
patches fit `max_soft_tokens` × pooling² with both sides multiples of pooling × patch
(`get_aspect_ratio_preserving_size`); the tower pools each pooling × pooling block of
patches into one soft token. A side that rounds to nothing is set to one block and the
other to floor(long / short) blocks, at most `max_soft_tokens` of them. Pure arithmetic,
no torch: the gateway counts here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)


class ImageSizeError(ValueError):
    """An image size the processor refuses (it would resize the image to 0 × 0)."""


@dataclass(frozen=True)
class SoftTokenRule:
    """The processor's settings (its defaults when the config leaves them out)."""

    patch_size: int = 16
    pooling_kernel_size: int = 3
    max_soft_tokens: int = 280

    def __post_init__(self) -> None:
        if self.max_soft_tokens not in SUPPORTED_SOFT_TOKENS:
            raise ValueError(
                f"max_soft_tokens={self.max_soft_tokens} is not one of {SUPPORTED_SOFT_TOKENS}"
            )

    @classmethod
    def from_preprocessor(cls, preprocessor: dict) -> SoftTokenRule:
        def value(key: str, default: int) -> int:
            found = preprocessor.get(key)
            return default if found is None else int(found)

        return cls(
            patch_size=value("patch_size", cls.patch_size),
            pooling_kernel_size=value("pooling_kernel_size", cls.pooling_kernel_size),
            max_soft_tokens=value("max_soft_tokens", cls.max_soft_tokens),
        )

    @property
    def block(self) -> int:
        """The side of one soft token in pixels (pooling × patch)."""
        return self.pooling_kernel_size * self.patch_size

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) the processor resizes to; ImageSizeError where it raises."""
        if width < 1 or height < 1:
            raise ImageSizeError(f"image size {width}x{height} must be at least 1x1")
        block, budget = self.block, self.max_soft_tokens
        target_px = budget * self.pooling_kernel_size**2 * self.patch_size**2
        factor = math.sqrt(target_px / (height * width))
        # The processor's float arithmetic, in its order: the same floors at the edges.
        new_height = int(math.floor(factor * height / block)) * block
        new_width = int(math.floor(factor * width / block)) * block
        if new_height == 0 and new_width == 0:
            raise ImageSizeError(
                f"image size {width}x{height} resizes to 0x0 under Gemma 4's rule (sides "
                f"multiples of {block} px within {budget} soft tokens)"
            )
        if new_height == 0:
            new_height = block
            new_width = min(int(math.floor(width / height)) * block, budget * block)
        elif new_width == 0:
            new_width = block
            new_height = min(int(math.floor(height / width)) * block, budget * block)
        if new_height * new_width > target_px:
            raise ImageSizeError(
                f"image size {width}x{height} resizes to {new_width}x{new_height}, more than "
                f"{budget} soft tokens under Gemma 4's rule"
            )
        return new_width, new_height

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, columns) of soft tokens of an image of this size."""
        new_width, new_height = self.target_size(width, height)
        return new_height // self.block, new_width // self.block

    def count(self, width: int, height: int) -> int:
        rows, columns = self.grid(width, height)
        return rows * columns
