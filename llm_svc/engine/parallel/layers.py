"""The model's layers split across tensor-parallel ranks (Megatron's scheme, as vLLM does).

Each layer keeps the parameter name of the layer it replaces, so the checkpoint loads by
name; a parameter's `shard` attribute (models/shard.py) names this rank's slice of the
checkpoint's tensor, which is all `load_weights` reads of it (sharding.py hands them over).
Column-parallel layers split their outputs and need no communication; row-parallel layers
split their inputs and all-reduce their output once; the vocab-parallel embedding holds a
contiguous slice of the (padded) vocabulary and all-reduces its rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llm_svc.engine.models.shard import Shard
from llm_svc.engine.parallel.group import RankGroup


class ColumnParallelLinear(nn.Module):
    """y = x W_r^T (+ b_r): this rank's output features `rows` of the full layer."""

    def __init__(self, in_features: int, rows: list[tuple[int, int]], bias: bool) -> None:
        super().__init__()
        out = sum(stop - start for start, stop in rows)
        self.weight = nn.Parameter(torch.empty(out, in_features))
        self.weight.shard = Shard.of(*rows)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out))
            self.bias.shard = Shard.of(*rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_r W_r^T): this rank's input features `cols`, summed over ranks;
    with `reduce=False` the partial x_r W_r^T is returned, for a caller that sums several
    partials before one all-reduce (the MoE block)."""

    def __init__(
        self, cols: tuple[int, int], out_features: int, group: RankGroup, reduce: bool = True
    ) -> None:
        super().__init__()
        start, stop = cols
        self.group, self.reduce = group, reduce
        self.weight = nn.Parameter(torch.empty(out_features, stop - start))
        self.weight.shard = Shard.of(cols, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)
        return self.group.all_reduce(partial) if self.reduce else partial


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + per_rank) of the vocabulary padded to a multiple of the ranks;
    ids outside this rank's slice embed to zero, and the all-reduce fills every row. The
    LM head (tied or not) uses the same slicing: `vocab_slice`."""

    def __init__(self, vocab: int, hidden: int, group: RankGroup) -> None:
        super().__init__()
        self.group = group
        self.start, self.stop = group.vocab_slice(vocab)
        self.weight = nn.Parameter(torch.empty(self.stop - self.start, hidden))
        self.weight.shard = vocab_rows(self.start, self.stop)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.stop)
        local = (ids - self.start).masked_fill(outside, 0)
        rows = F.embedding(local, self.weight).masked_fill(outside[:, None], 0)
        return self.group.all_reduce(rows)


def vocab_rows(start: int, stop: int) -> Shard:
    """Rows [start, stop) of a [vocab, hidden] tensor, zero-padded past its last row."""
    return Shard(0, ((start, stop),), pad=True)


class ParallelLMHead(nn.Module):
    """The untied LM head's rows for this rank's vocabulary slice (logits gathered later)."""

    def __init__(self, vocab: int, hidden: int, group: RankGroup) -> None:
        super().__init__()
        start, stop = group.vocab_slice(vocab)
        self.weight = nn.Parameter(torch.empty(stop - start, hidden))
        self.weight.shard = vocab_rows(start, stop)
