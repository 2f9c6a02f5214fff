"""Span checks, padding and interval arithmetic on input_ids (DESIGN.md §2).

Offsets are inclusive (start, end) pairs. Padding never changes the sequence length and
never mutates its input; ids are int64 from here on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from iris.multimodal.item import Modality, MultimodalItem

TEXT = 0
MODALITY_CODES = {Modality.IMAGE: 1, Modality.VIDEO: 2, Modality.AUDIO: 3}


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


def token_modalities(length: int, items: Sequence[MultimodalItem]) -> np.ndarray:
    """int8 [length]: 0 for text, the modality code of the item elsewhere (spans checked)."""
    check_spans(items, length)
    out = np.zeros(length, dtype=np.int8)
    for item in items:
        for start, end in item.offsets:
            out[start : end + 1] = MODALITY_CODES[Modality(item.modality)]
    return out


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


def pad_with_start_end(
    input_ids: Sequence[int] | np.ndarray,
    items: Sequence[MultimodalItem],
    start_ids: Sequence[int],
    end_ids: Sequence[int],
    new_item_start_ids: Sequence[int] | None = None,
) -> np.ndarray:
    """Fill the tokens strictly between start/end token pairs with the items' sentinels.

    A start token in `new_item_start_ids` (default: every start id) opens the next item; other
    start tokens open one more span of the current item (tiles of one image). Sets each
    item's offsets to the spans found. Unequal start/end counts, nested or unmatched pairs,
    and more or fewer openers than items are errors.
    """
    out = _as_int64(input_ids)
    starts, ends = set(start_ids), set(end_ids)
    openers = set(start_ids if new_item_start_ids is None else new_item_start_ids)
    start_positions = np.flatnonzero(np.isin(out, list(starts)))
    end_positions = np.flatnonzero(np.isin(out, list(ends)))
    if len(start_positions) != len(end_positions):
        raise ValueError(
            f"{len(start_positions)} start tokens but {len(end_positions)} end tokens in input_ids"
        )
    spans_per_item: list[list[tuple[int, int]]] = [[] for _ in items]
    item_index = -1
    previous_end = -1
    for start, end in zip(start_positions.tolist(), end_positions.tolist(), strict=True):
        if not previous_end < start < end:
            raise ValueError(f"start token at {start} and end token at {end} do not pair up")
        previous_end = end
        if int(out[start]) in openers:
            item_index += 1
        if item_index < 0:
            raise ValueError(f"span at {start} opens with a start token that begins no item")
        if item_index >= len(items):
            raise ValueError(f"more image placeholders than items ({len(items)})")
        if end - start > 1:
            spans_per_item[item_index].append((start + 1, end - 1))
    if item_index + 1 != len(items):
        raise ValueError(f"{item_index + 1} image placeholders but {len(items)} items")
    for item, spans in zip(items, spans_per_item, strict=True):
        item.offsets = spans
    return pad_with_offsets(out, items)


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


def count_mm_tokens_in_chunk(
    offsets: Sequence[tuple[int, int]], chunk_start: int, chunk_end: int
) -> int:
    """Number of tokens of the spans `offsets` inside [chunk_start, chunk_end)."""
    return sum(max(0, min(end + 1, chunk_end) - max(start, chunk_start)) for start, end in offsets)


def count_mm_tokens_per_request(
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    offsets_per_request: Sequence[Sequence[tuple[int, int]]],
) -> list[int]:
    """Image tokens each request's chunk [prefix, prefix + extend) covers (no device sync)."""
    return [
        count_mm_tokens_in_chunk(offsets, prefix, prefix + extend)
        for prefix, extend, offsets in zip(
            prefix_lens, extend_lens, offsets_per_request, strict=True
        )
    ]
