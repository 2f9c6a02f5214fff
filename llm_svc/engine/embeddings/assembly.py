"""A step's input embeddings: text rows from the embedding table, image rows scattered in.

Everything about where image rows go is computed on the host from the items' offsets, so
assembling a chunk never waits on the device. Each chunk's image rows are gathered and
checked on their own (`chunk_image_rows`) before the batch is put together, so one
request's bad embedding ends that request, not the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from iris_kernels import dest_rows_for_chunk, scatter_rows
from llm_svc.engine.errors import RequestDataError
from llm_svc.engine.models.decoder import DeepstackRows
from llm_svc.engine.scheduler import ScheduledChunk


@dataclass(frozen=True)
class ChunkImageRows:
    """One chunk's image rows: `source[i]` goes to chunk row `dest_rows[i]` (relative to the
    chunk's start; CPU, ascending)."""

    dest_rows: torch.Tensor
    source: torch.Tensor


def chunk_image_rows(chunk: ScheduledChunk, hidden: int) -> ChunkImageRows | None:
    """The image rows `chunk` needs, from its sequence's held embeddings; None when the
    chunk covers no image token. An embedding that is not held, has too few rows or a
    width other than `hidden` raises RequestDataError (rows are never padded). Only
    shapes are read, so nothing waits on the device."""
    seq = chunk.seq
    if not seq.items:
        return None
    end = chunk.start + chunk.num_tokens
    plan = dest_rows_for_chunk([item.offsets for item in seq.items], chunk.start, end)
    if not plan.num_rows:
        return None
    held = [seq.embeddings.get(index) for index in range(len(seq.items))]
    for index in plan.item_indices:
        embedding = held[index]
        if embedding is not None and (embedding.ndim != 2 or embedding.shape[1] != hidden):
            raise RequestDataError(
                f"items[{index}] embedding has shape {tuple(embedding.shape)}: its rows "
                f"must be {hidden} wide",
                index,
            )
    try:
        source = plan.gather(held)
    except ValueError as err:
        raise RequestDataError(f"request {seq.request_id!r}: {err}") from None
    return ChunkImageRows(plan.dest_rows, source)


@torch.inference_mode()
def assemble_input_embeds(
    embed, input_ids: torch.Tensor, image_rows: list[ChunkImageRows | None],
    query_starts: list[int], vocab_size: int, hidden: int | None = None,
) -> torch.Tensor | None:  # fmt: skip
    """[T, H] input embeddings for a packed step, or None when no chunk holds image tokens.

    `embed` maps ids to rows (the model's embedding table); `image_rows[i]` are chunk i's
    (from `chunk_image_rows`) and `query_starts[i]` is where chunk i starts in the packed ids.
    With `hidden` set, only the first `hidden` columns of the image rows (the main
    embedding; deepstack levels follow it, `deepstack_rows`) enter the input.
    """
    rows = [r.dest_rows + start for r, start in zip(image_rows, query_starts, strict=True) if r]
    if not rows:
        return None
    dest_rows = torch.cat(rows)
    # The image rows are known (dest_rows) before the sentinels are clamped into the vocab,
    # so a clamped sentinel can never pass for text.
    embeds = embed(input_ids.clamp(0, vocab_size - 1))
    source = torch.cat([r.source for r in image_rows if r is not None])
    if hidden is not None:
        source = source[:, :hidden]
    return scatter_rows(embeds, source.to(embeds.dtype), dest_rows)


def deepstack_rows(
    image_rows: list[ChunkImageRows | None], query_starts: list[int], hidden: int, levels: int
) -> DeepstackRows | None:
    """The step's deepstack input (packed rows, one [R, hidden] slice per level) from the
    chunks' wide image rows, or None without levels or image rows. Only the rows each chunk
    covers are here, so a chunk that cuts an image adds exactly its part of every level."""
    if not levels:
        return None
    pairs = [(r.dest_rows + start, r.source) for r, start in zip(image_rows, query_starts,
             strict=True) if r]  # fmt: skip
    if not pairs:
        return None
    rows = torch.cat([dest for dest, _ in pairs])
    source = torch.cat([src for _, src in pairs])
    width = hidden * (1 + levels)
    if source.shape[1] != width:
        raise ValueError(f"image rows are {source.shape[1]} wide, expected {width}")
    return DeepstackRows(rows, [source[:, (1 + i) * hidden : (2 + i) * hidden] for i in
                                range(levels)])  # fmt: skip
