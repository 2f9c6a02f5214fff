"""Qwen2-VL's multimodal rotary positions (M-RoPE) from the items' spans and grids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def mrope_positions(length: int, items: Sequence[Any], merge_size: int) -> tuple[np.ndarray, int]:
    """Positions [3, length] int64 (t, h, w rows) and the delta.

    Text tokens advance all three rows together; an image's tokens take (t, h, w) from its
    merged grid, offset by the position where the image starts, and the text after it
    resumes at that start + max(merged h, merged w). Tokens decoded after the prompt sit at
    index + delta on every row.
    """
    spans = sorted(
        (start, end, tuple(item.grid)) for item in items for (start, end) in item.offsets
    )
    positions = np.empty((3, length), dtype=np.int64)
    cursor = 0  # index in the ids
    position = 0  # next text position
    for start, end, (t, h, w) in spans:
        text = start - cursor
        positions[:, cursor:start] = np.arange(position, position + text)
        position += text
        llm_h, llm_w = h // merge_size, w // merge_size
        if end - start + 1 != t * llm_h * llm_w:
            raise ValueError(
                f"image span ({start}, {end}) has {end - start + 1} tokens but its grid "
                f"{(t, h, w)} gives {t * llm_h * llm_w}"
            )
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(llm_h), np.arange(llm_w), indexing="ij")
        positions[0, start : end + 1] = tt.reshape(-1) + position
        positions[1, start : end + 1] = hh.reshape(-1) + position
        positions[2, start : end + 1] = ww.reshape(-1) + position
        position += max(h, w) // merge_size
        cursor = end + 1
    positions[:, cursor:] = np.arange(position, position + length - cursor)
    delta = int(positions.max()) + 1 - length if length else 0
    return positions, delta
