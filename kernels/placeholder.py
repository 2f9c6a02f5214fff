"""Placeholder mask: which positions of padded input_ids hold an image sentinel (isin).

Take it before ids are clamped into the vocabulary for the text embedding: sentinels are
≥ 1_000_000 by the contract and clamping would make them ordinary tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernels.backend import jit, resolve_backend

BLOCK_SIZE = 1024


@jit
def _placeholder_mask_kernel(ids_ptr, sentinels_ptr, out_ptr, N, S, BLOCK_SIZE: tl.constexpr):
    # One program marks BLOCK_SIZE consecutive positions.
    pid = tl.program_id(0).to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    in_range = offsets < N
    ids = tl.load(ids_ptr + offsets, mask=in_range, other=0)
    hit = tl.full([BLOCK_SIZE], 0, tl.int1)
    # A request holds a few sentinels per image, so one scalar compare per sentinel is cheap
    # and needs no reduction (tl.max and friends are jit functions bound to one mode).
    for s in range(S):
        sentinel = tl.load(sentinels_ptr + s)
        hit = hit | (ids == sentinel)
    tl.store(out_ptr + offsets, hit.to(tl.int8), mask=in_range)


def _sentinel_tensor(sentinels: torch.Tensor | Sequence[int], device) -> torch.Tensor:
    if isinstance(sentinels, torch.Tensor):
        if sentinels.dtype != torch.int64:
            raise ValueError(f"sentinels must be int64, got {sentinels.dtype}")
        return sentinels.reshape(-1).to(device, non_blocking=True).contiguous()
    values = list(sentinels)
    for value in values:
        if not -(2**63) <= int(value) < 2**63:
            raise ValueError(f"sentinel {value} does not fit in int64")
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)


def placeholder_mask(
    input_ids: torch.Tensor,
    sentinels: torch.Tensor | Sequence[int],
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Bool [N]: True where input_ids (int64 [N]) equals any of `sentinels`.

    `sentinels` is a list of ints (copied to the device without a sync) or an int64 tensor.
    Raises ValueError for ids that are not int64 [N].
    """
    if input_ids.dtype != torch.int64 or input_ids.dim() != 1:
        raise ValueError(
            f"input_ids must be int64 [N], got {input_ids.dtype} {tuple(input_ids.shape)}"
        )
    values = _sentinel_tensor(sentinels, input_ids.device)
    if resolve_backend("placeholder_mask", backend, input_ids.device) == "torch":
        return placeholder_mask_torch(input_ids, values)
    count = input_ids.shape[0]
    out = torch.zeros(count, dtype=torch.uint8, device=input_ids.device)
    if count == 0 or values.numel() == 0:
        return out.view(torch.bool)
    ids = input_ids.contiguous()
    grid = (triton.cdiv(count, BLOCK_SIZE),)
    _placeholder_mask_kernel[grid](
        ids,
        values,
        out,
        count,
        values.numel(),
        BLOCK_SIZE=BLOCK_SIZE,
    )
    return out.view(torch.bool)


def placeholder_mask_torch(input_ids: torch.Tensor, sentinels: torch.Tensor) -> torch.Tensor:
    """The torch twin."""
    return torch.isin(input_ids, sentinels)
