"""Row scatter: `dest[dest_rows[i]] = src[i]`, in place — how image embeddings enter a chunk;
and row scatter-add, `dest[dest_rows[i]] += src[i]` — how a deepstack level joins the hidden
states after its decoder layer (Qwen3-VL).

The caller computes `dest_rows` on the host from item offsets (`dest_rows_for_chunk`), so the
bounds check runs on the host and assembling a chunk needs no device→host sync. Rows should
be distinct; with duplicates, which source row lands is unspecified (as with index_copy_).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from iris_kernels.backend import jit, resolve_backend

ROW_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Widest tile of one row a program copies; wider rows take several programs.
MAX_BLOCK_SIZE = 2048


@jit
def _row_kernel(
    dest_ptr,
    src_ptr,
    rows_ptr,
    D,
    dest_row_stride,
    src_row_stride,
    BLOCK_SIZE: tl.constexpr,
    ADD: tl.constexpr,
):
    # One program moves one tile of one source row into its destination row: a copy, or
    # (ADD) an add.
    i = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    # The destination row of source row i (int64, so row * stride cannot overflow).
    row = tl.load(rows_ptr + i)
    cols = tile * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    # The last tile of a row whose width is not a power of two is partial.
    in_row = cols < D
    values = tl.load(src_ptr + i * src_row_stride + cols, mask=in_row)
    out = dest_ptr + row * dest_row_stride + cols
    if ADD:
        # Read-add-write without atomics: the rows are distinct, so no two programs share
        # a destination element. Added in float32 and rounded once to the tensors' dtype,
        # which is what torch's index_add_ computes for bf16 / fp16 too.
        total = tl.load(out, mask=in_row).to(tl.float32) + values.to(tl.float32)
        values = total.to(dest_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
    tl.store(out, values, mask=in_row)


def check_row_operands(dest: torch.Tensor, src: torch.Tensor) -> None:
    """Raise ValueError unless dest [N, D] and src [M, D] can exchange rows.

    Same dtype (one of bf16/fp16/fp32) and device, 2-D, equal width, unit stride along rows.
    """
    if dest.dim() != 2 or src.dim() != 2:
        raise ValueError(
            f"dest and src must be 2-D, got {tuple(dest.shape)} and {tuple(src.shape)}"
        )
    if dest.shape[1] != src.shape[1]:
        raise ValueError(f"row width differs: dest has {dest.shape[1]}, src has {src.shape[1]}")
    if dest.dtype != src.dtype:
        raise ValueError(f"dtype differs: dest is {dest.dtype}, src is {src.dtype}")
    if dest.dtype not in ROW_DTYPES:
        raise ValueError(f"dtype {dest.dtype} not supported; expected one of {ROW_DTYPES}")
    if dest.device != src.device:
        raise ValueError(f"device differs: dest on {dest.device}, src on {src.device}")
    for name, tensor in (("dest", dest), ("src", src)):
        if tensor.shape[1] > 1 and tensor.stride(1) != 1:
            raise ValueError(f"{name} rows must be contiguous, got strides {tensor.stride()}")


def rows_on_device(
    dest_rows: torch.Tensor | Sequence[int], count: int, limit: int, device: torch.device
) -> torch.Tensor:
    """Validate row indices against [0, limit) and return them as int64 on `device`.

    Host rows (a list, or a CPU tensor) are checked on the host before the copy, so no
    device sync happens; rows already on the device are checked there, which syncs.
    """
    if isinstance(dest_rows, torch.Tensor):
        rows = dest_rows
        if rows.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise ValueError(f"dest_rows must hold integers, got {rows.dtype}")
    else:
        rows = torch.as_tensor(list(dest_rows), dtype=torch.int64)
    if rows.dim() != 1 or rows.numel() != count:
        raise ValueError(f"dest_rows must have shape [{count}], got {tuple(rows.shape)}")
    if count:
        low, high = rows.min(), rows.max()
        if int(low) < 0 or int(high) >= limit:
            bad = int(low) if int(low) < 0 else int(high)
            raise ValueError(f"dest_rows holds row {bad} outside [0, {limit})")
    return rows.to(device=device, dtype=torch.int64, non_blocking=True)


def _move_rows(
    dest: torch.Tensor,
    src: torch.Tensor,
    dest_rows: torch.Tensor | Sequence[int],
    backend: str | None,
    add: bool,
) -> torch.Tensor:
    """The checks and the launch both row operations share."""
    check_row_operands(dest, src)
    rows = rows_on_device(dest_rows, src.shape[0], dest.shape[0], dest.device)
    name = "scatter_add_rows" if add else "scatter_rows"
    if resolve_backend(name, backend, dest.device) == "torch":
        return (
            scatter_add_rows_torch(dest, src, rows) if add else scatter_rows_torch(dest, src, rows)
        )
    count, width = src.shape
    if count == 0 or width == 0:
        return dest
    block_size = min(triton.next_power_of_2(width), MAX_BLOCK_SIZE)
    grid = (count, triton.cdiv(width, block_size))
    _row_kernel[grid](
        dest, src, rows, width, dest.stride(0), src.stride(0), BLOCK_SIZE=block_size, ADD=add
    )
    return dest


def scatter_rows(
    dest: torch.Tensor,
    src: torch.Tensor,
    dest_rows: torch.Tensor | Sequence[int],
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """In place `dest[dest_rows[i]] = src[i]` for dest [N, D], src [M, D]; returns dest.

    `dest_rows` is a list or a CPU int tensor of M rows in [0, N) (checked on the host, no
    device sync), or a tensor on dest's device (checked there, which syncs). Raises
    ValueError on mismatched shapes, dtypes, devices, strides, or rows out of range.
    """
    return _move_rows(dest, src, dest_rows, backend, add=False)


def scatter_rows_torch(dest: torch.Tensor, src: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The torch twin of the Triton kernel (rows already checked and on dest's device)."""
    return dest.index_copy_(0, rows, src)


def scatter_add_rows(
    dest: torch.Tensor,
    src: torch.Tensor,
    dest_rows: torch.Tensor | Sequence[int],
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """In place `dest[dest_rows[i]] += src[i]` for dest [N, D], src [M, D]; returns dest.

    The rows must be distinct (an image's rows in one step always are). Checks as
    `scatter_rows`: rows on the host cost no device sync; bad operands are a ValueError.
    `src` may be a column slice of a wider tensor (unit stride along its rows).
    """
    return _move_rows(dest, src, dest_rows, backend, add=True)


def scatter_add_rows_torch(
    dest: torch.Tensor, src: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """The torch twin of the scatter-add kernel (rows already checked and on dest's device)."""
    return dest.index_add_(0, rows, src)
