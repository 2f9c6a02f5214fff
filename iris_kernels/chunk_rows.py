"""Host-side plan of a chunk's image rows: which chunk rows get which item embedding rows.

Built on the contract's interval arithmetic (`iris.multimodal.chunk_overlaps`), in pure
Python/torch on the CPU, so planning a chunk never waits on the device:

    plan = dest_rows_for_chunk([item.offsets for item in items], start, end)
    src = plan.gather([embedding_of(item) for item in items])  # on the device, no sync
    scatter_rows(chunk_embeds, src, plan.dest_rows)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from iris.multimodal import Overlap, chunk_overlaps


@dataclass(frozen=True)
class ChunkRows:
    """The image rows of one chunk.

    `dest_rows` (int64, CPU, ascending) are rows relative to the chunk start; `pieces` are the
    overlaps in the same order: item `item_index`'s embedding rows
    [src_start, src_start + length) go to chunk rows [dst_start, dst_start + length).
    """

    dest_rows: torch.Tensor
    pieces: tuple[Overlap, ...]

    @property
    def num_rows(self) -> int:
        """How many chunk rows are image rows (== len(dest_rows))."""
        return int(self.dest_rows.numel())

    @property
    def item_indices(self) -> tuple[int, ...]:
        """The items this chunk touches, ascending, each once."""
        return tuple(sorted({piece.item_index for piece in self.pieces}))

    def gather(self, embeddings: Sequence[torch.Tensor]) -> torch.Tensor:
        """Concatenate the needed rows of each item's embedding in dest-row order.

        `embeddings[i]` is item i's [token_count, D] embedding (only the items in
        `item_indices` are read; others may be None). An embedding with too few rows is a
        ValueError — rows are never padded.
        """
        if not self.pieces:
            raise ValueError("this chunk has no image rows to gather")
        slices = []
        for piece in self.pieces:
            embedding = embeddings[piece.item_index]
            end = piece.src_start + piece.length
            if embedding is None or embedding.shape[0] < end:
                have = None if embedding is None else embedding.shape[0]
                raise ValueError(
                    f"item {piece.item_index} embedding has {have} rows; chunk needs rows "
                    f"[{piece.src_start}, {end})"
                )
            slices.append(embedding[piece.src_start : end])
        return slices[0] if len(slices) == 1 else torch.cat(slices)


def dest_rows_for_chunk(
    offsets_per_item: Sequence[Sequence[tuple[int, int]]], chunk_start: int, chunk_end: int
) -> ChunkRows:
    """Plan the image rows of chunk [chunk_start, chunk_end) from items' inclusive offsets.

    Raises ValueError for an empty-or-negative chunk range. Spans of different items must
    not overlap (the contract's `check_spans` guarantees it for padded requests).
    """
    if chunk_start < 0 or chunk_end < chunk_start:
        raise ValueError(f"chunk [{chunk_start}, {chunk_end}) is not a valid range")
    pieces = tuple(
        sorted(
            chunk_overlaps(offsets_per_item, chunk_start, chunk_end),
            key=lambda piece: piece.dst_start,
        )
    )
    if not pieces:
        return ChunkRows(torch.empty(0, dtype=torch.int64), ())
    rows = np.concatenate(
        [np.arange(p.dst_start, p.dst_start + p.length, dtype=np.int64) for p in pieces]
    )
    return ChunkRows(torch.from_numpy(rows), pieces)
