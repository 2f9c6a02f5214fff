"""Masked row scatter for callers without offsets: row-wise `torch.masked_scatter`.

The k-th True row of `mask` receives `src[k]`. A src with fewer rows than the mask's count is
an error, never a silent partial write; checking it reads the count back from the device
(one sync per call), which is why chunk assembly uses `scatter_rows` with host rows instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import jit, resolve_backend
from kernels.scatter import MAX_BLOCK_SIZE, check_row_operands


@jit
def _masked_scatter_rows_kernel(
    dest_ptr,
    src_ptr,
    mask_ptr,
    position_ptr,
    D,
    dest_row_stride,
    src_row_stride,
    BLOCK_SIZE: tl.constexpr,
):
    # One program handles one tile of one destination row.
    row = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    selected = tl.load(mask_ptr + row) != 0
    # Inclusive prefix sum of the mask: the k-th selected row reads source row k - 1.
    src_row = tl.load(position_ptr + row) - 1
    cols = tile * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    # Unselected rows load and store nothing; the last tile of a row may be partial.
    active = (cols < D) & selected
    values = tl.load(src_ptr + src_row * src_row_stride + cols, mask=active)
    tl.store(dest_ptr + row * dest_row_stride + cols, values, mask=active)


def masked_scatter_rows(
    dest: torch.Tensor, mask: torch.Tensor, src: torch.Tensor, *, backend: str | None = None
) -> torch.Tensor:
    """In place: the k-th row of dest [N, D] where mask [N] is True becomes src[k]; returns dest.

    Raises ValueError on mismatched shapes, dtypes, devices or strides, a non-bool mask, or a
    src with fewer rows than mask.sum() (this check syncs with the device).
    """
    check_row_operands(dest, src)
    if mask.dtype != torch.bool or mask.dim() != 1 or mask.shape[0] != dest.shape[0]:
        raise ValueError(
            f"mask must be bool [{dest.shape[0]}], got {mask.dtype} {tuple(mask.shape)}"
        )
    if mask.device != dest.device:
        raise ValueError(f"device differs: dest on {dest.device}, mask on {mask.device}")
    positions = torch.cumsum(mask, 0)
    selected = int(positions[-1]) if positions.numel() else 0
    if selected > src.shape[0]:
        raise ValueError(f"mask selects {selected} rows but src has only {src.shape[0]}")
    if resolve_backend("masked_scatter_rows", backend, dest.device) == "torch":
        return masked_scatter_rows_torch(dest, mask, src)
    rows, width = dest.shape
    if selected == 0 or width == 0:
        return dest
    block_size = min(triton.next_power_of_2(width), MAX_BLOCK_SIZE)
    grid = (rows, triton.cdiv(width, block_size))
    _masked_scatter_rows_kernel[grid](
        dest,
        src,
        mask.contiguous().view(torch.uint8),
        positions,
        width,
        dest.stride(0),
        src.stride(0),
        BLOCK_SIZE=block_size,
    )
    return dest


def masked_scatter_rows_torch(
    dest: torch.Tensor, mask: torch.Tensor, src: torch.Tensor
) -> torch.Tensor:
    """The torch twin (the row count is already checked)."""
    return dest.masked_scatter_(mask.unsqueeze(1), src)
