"""A tensor-parallel rank's part of a parameter, read from the checkpoint without the rest.

A `Shard` names ranges along one dimension of the checkpoint's tensor; `cut` takes them from
anything sliced like a tensor: the tensor itself, or a safetensors slice (`get_slice`), from
which only the ranges asked for are read, so a rank reads and holds its share of each
tensor, never the whole (llm_svc/engine/models/loader.py). `Concatenated` slices several
stored tensors as one, for a parameter the checkpoint splits (an expert's gate and up
projections, stored apart and held as one [2I, H] block).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Shard:
    """Along `dim`, the ranges `blocks` of the whole tensor, one after another; with `pad`,
    rows past the tensor's end are zeros (the vocabulary padded to a multiple of the
    ranks), else a range past the end is an error."""

    dim: int
    blocks: tuple[tuple[int, int], ...]
    pad: bool = False

    @staticmethod
    def of(*blocks: tuple[int, int], dim: int = 0) -> Shard:
        return Shard(dim, tuple(blocks))

    @property
    def size(self) -> int:
        return sum(stop - start for start, stop in self.blocks)

    def along(self, dim: int) -> Shard:
        """The same ranges along `dim` (the tensor stored transposed, or one of a stack)."""
        return Shard(dim, self.blocks, self.pad)

    def cut(self, source, out: torch.Tensor | None = None) -> torch.Tensor:
        """This part of `source`, copied into `out` when given. Otherwise one range is
        returned as `source` gives it (of a tensor, a view: nothing copied), and several, or
        padding, are copied into a tensor allocated here."""
        lead = (slice(None),) * self.dim
        parts = [source[(*lead, slice(start, stop))] for start, stop in self.blocks]
        for part, (start, stop) in zip(parts, self.blocks, strict=True):
            if part.shape[self.dim] != stop - start and not self.pad:
                raise ValueError(
                    f"shape {tuple(part.shape)} ends before rows [{start}, {stop}) of dim "
                    f"{self.dim}"
                )
        if out is None and len(parts) == 1 and not self.pad:
            return parts[0]
        if out is None:
            shape = list(parts[0].shape)
            shape[self.dim] = self.size
            out = parts[0].new_empty(shape)
        offset = 0
        for part in parts:
            rows = part.shape[self.dim]
            out.narrow(self.dim, offset, rows).copy_(part)
            offset += rows
        out.narrow(self.dim, offset, self.size - offset).zero_()
        return out


class Concatenated:
    """Tensors (or safetensors slices) `parts` of `lengths` rows, sliced as their
    concatenation along dim 0; a slice within one part is that part's slice, unchanged."""

    def __init__(self, parts: list, lengths: list[int]) -> None:
        self.parts, self.lengths = parts, lengths

    def __getitem__(self, index: tuple[slice, ...]) -> torch.Tensor:
        first, rest = index[0], index[1:]
        start, stop, _ = first.indices(sum(self.lengths))
        pieces, offset = [], 0
        for part, length in zip(self.parts, self.lengths, strict=True):
            low, high = max(start, offset), min(stop, offset + length)
            if low < high:
                pieces.append(part[(slice(low - offset, high - offset), *rest)])
            offset += length
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)
