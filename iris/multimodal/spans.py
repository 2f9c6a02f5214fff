"""Span checks, padding and interval arithmetic on input_ids (docs/design/multimodal.md).

Offsets are inclusive (start, end) pairs. Padding never changes the sequence length and
never mutates its input; ids are int64 from here on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from iris.multimodal.item import MultimodalItem


def _as_int64(input_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.array(input_ids, dtype=np.int64, copy=True).reshape(-1)


def check_spans(items: Sequence[MultimodalItem], length: int) -> None:
    """Raise ValueError naming the span if any is empty, out of [0, length) or overlapping."""
    spans = []
    for index, item in enumerate(items):
        for start, end in item.offsets:
            if start > end:
                raise ValueError(f"item {index}: span ({start}, {end}) has start > end")
            if start < 0 or end >= length:
                raise ValueError(
                    f"item {index}: span ({start}, {end}) outside the sequence [0, {length - 1}]"
                )
            spans.append((start, end, index))
    spans.sort()
    for (s0, e0, i0), (s1, e1, i1) in zip(spans, spans[1:], strict=False):
        if s1 <= e0:
            raise ValueError(f"item {i0} span ({s0}, {e0}) overlaps item {i1} span ({s1}, {e1})")


def pad_with_offsets(
    input_ids: Sequence[int] | np.ndarray, items: Sequence[MultimodalItem]
) -> np.ndarray:
    """Fill each item's spans with its sentinels; the rotation runs on across an item's spans.

    Returns a new int64 array of the same length; the input is not touched.
    """
    out = _as_int64(input_ids)
    check_spans(items, len(out))
    for item in items:
        sequence = item.padding_sequence(item.span_token_count)
        cursor = 0
        for start, end in item.offsets:
            size = end - start + 1
            out[start : end + 1] = sequence[cursor : cursor + size]
            cursor += size
    return out


@dataclass(frozen=True)
class Overlap:
    """Rows of one item inside a chunk: item rows [src_start, src_start + length) go to
    chunk rows [dst_start, dst_start + length)."""

    item_index: int
    src_start: int
    dst_start: int
    length: int


def chunk_overlaps(
    offsets_per_item: Sequence[Sequence[tuple[int, int]]], chunk_start: int, chunk_end: int
) -> list[Overlap]:
    """Intersect every item's spans with the chunk [chunk_start, chunk_end) — pure host math.

    Item rows are numbered across the item's spans in order, the way its embedding is laid.
    """
    result = []
    for index, offsets in enumerate(offsets_per_item):
        row = 0
        for start, end in offsets:
            lo, hi = max(start, chunk_start), min(end + 1, chunk_end)
            if lo < hi:
                result.append(Overlap(index, row + lo - start, lo - chunk_start, hi - lo))
            row += end - start + 1
    return result
