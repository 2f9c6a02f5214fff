"""A step's input embeddings: text rows from the embedding table, image rows scattered in.

Everything about where image rows go is computed on the host from the items' offsets, so
assembling a chunk never waits on the device.
"""

from __future__ import annotations

import torch

from kernels import dest_rows_for_chunk, scatter_rows
from llm_svc.engine.scheduler import ScheduledChunk


@torch.inference_mode()
def assemble_input_embeds(
    embed, input_ids: torch.Tensor, chunks: list[ScheduledChunk], query_starts: list[int],
    vocab_size: int,
) -> torch.Tensor | None:  # fmt: skip
    """[T, H] input embeddings for a packed step, or None when no chunk holds image tokens.

    `embed` maps ids to rows (the model's embedding table); `query_starts[i]` is where chunk
    i starts in the packed ids. Image rows come from each sequence's held embeddings, sliced
    by offsets; an embedding with too few rows raises ValueError (rows are never padded).
    """
    rows, sources = [], []
    for chunk, flat_start in zip(chunks, query_starts, strict=True):
        seq = chunk.seq
        if not seq.items:
            continue
        end = chunk.start + chunk.num_tokens
        plan = dest_rows_for_chunk([item.offsets for item in seq.items], chunk.start, end)
        if not plan.num_rows:
            continue
        held = [seq.embeddings.get(index) for index in range(len(seq.items))]
        sources.append(plan.gather(held))
        rows.append(plan.dest_rows + flat_start)
    if not rows:
        return None
    dest_rows = torch.cat(rows)
    # The image rows are known (dest_rows) before the sentinels are clamped into the vocab,
    # so a clamped sentinel can never pass for text.
    embeds = embed(input_ids.clamp(0, vocab_size - 1))
    source = torch.cat(sources).to(embeds.dtype)
    return scatter_rows(embeds, source, dest_rows)
