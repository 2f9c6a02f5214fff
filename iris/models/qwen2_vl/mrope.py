"""Qwen2-VL's multimodal rotary positions (M-RoPE) from the items' spans and grids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def mrope_positions(
    length: int, items: Sequence[Any], merge_size: int, time_interval: float | None = None
) -> tuple[np.ndarray, int]:
    """Positions [3, length] int64 (t, h, w rows) and the delta.

    Text tokens advance all three rows together; an image's tokens take (t, h, w) from its
    merged grid, offset by the position where the image starts, and the text after it
    resumes at that start + max(merged h, merged w). Tokens decoded after the prompt sit at
    index + delta on every row.

    With a `time_interval` (Qwen2.5-VL), frame groups (VIDEO items) whose spans follow each
    other are one video, as HF's get_rope_index sees it: group j's temporal row is
    start + int(j x time_interval) (its absolute time), h and w as an image's, and the text
    after the video resumes at start + max(merged h, merged w). Without one (Qwen3-VL,
    whose timestamps are in the text), each group is placed as an image of grid (1, h, w).
    """
    spans = sorted(
        (start, end, tuple(item.grid), _is_video(item))
        for item in items
        for (start, end) in item.offsets
    )
    positions = np.empty((3, length), dtype=np.int64)
    cursor = 0  # index in the ids
    position = 0  # next text position
    group = 0  # index of a frame group inside its video
    video_start = 0
    previous_end = -2
    for start, end, (t, h, w), video in spans:
        if time_interval is not None and video:
            group = group + 1 if start == previous_end + 1 else 0
            previous_end = end
            _check(start, end, (t, h, w), merge_size)
            if group == 0:
                text = start - cursor
                positions[:, cursor:start] = np.arange(position, position + text)
                position += text
                video_start = position
            llm_h, llm_w = h // merge_size, w // merge_size
            # HF: (arange(grid_t) * interval).long() in float32, truncated.
            temporal = int(np.float32(group) * np.float32(time_interval))
            hh, ww = np.meshgrid(np.arange(llm_h), np.arange(llm_w), indexing="ij")
            positions[0, start : end + 1] = video_start + temporal
            positions[1, start : end + 1] = hh.reshape(-1) + video_start
            positions[2, start : end + 1] = ww.reshape(-1) + video_start
            position = video_start + max(h, w) // merge_size
            cursor = end + 1
            continue
        previous_end = -2
        text = start - cursor
        positions[:, cursor:start] = np.arange(position, position + text)
        position += text
        llm_h, llm_w = h // merge_size, w // merge_size
        _check(start, end, (t, h, w), merge_size)
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(llm_h), np.arange(llm_w), indexing="ij")
        positions[0, start : end + 1] = tt.reshape(-1) + position
        positions[1, start : end + 1] = hh.reshape(-1) + position
        positions[2, start : end + 1] = ww.reshape(-1) + position
        position += max(h, w) // merge_size
        cursor = end + 1
    positions[:, cursor:] = np.arange(position, position + length - cursor)
    delta = int(positions.max()) + 1 - length if length else 0
    return positions, delta


def _is_video(item: Any) -> bool:
    return getattr(item, "modality", None) == "video"


def _check(start: int, end: int, grid: tuple[int, ...], merge_size: int) -> None:
    t, h, w = grid
    tokens = t * (h // merge_size) * (w // merge_size)
    if end - start + 1 != tokens:
        raise ValueError(
            f"image span ({start}, {end}) has {end - start + 1} tokens but its grid "
            f"{(t, h, w)} gives {tokens}"
        )
