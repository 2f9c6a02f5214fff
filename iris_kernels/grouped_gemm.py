"""Grouped GEMM over experts: rows sorted by expert, one launch for every expert's product.

`x` [M, K] holds the routed (token, expert) rows sorted by expert, `counts` [E] how many rows
each expert owns (a contiguous slice, in expert order; an expert may own none), `weight`
[E, N, K] the experts' stacked projections. Row r of expert e gets `x[r] @ weight[e].T`,
optionally times `row_scale[r]` (the routing weight, applied in the down projection's
epilogue). The fused MoE (llm_svc/engine/models/moe.py) launches it twice: gate/up, then down.

The tile plan (`expert_tiles`) is built on the device from `counts`, so a launch needs no
device→host sync: the grid is sized for the worst case, cdiv(M, BLOCK_M) + E tiles (each
expert's last tile may be partial), and the tiles past the real ones own no rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris_kernels.backend import jit, resolve_backend
from iris_kernels.paged_attention_decode import dot_precision, upcast_dots

GEMM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BLOCK_M = 16  # rows per tile; small, because a decode step routes few tokens to an expert
MAX_BLOCK_N = 64
MAX_BLOCK_K = 64


@jit
def _grouped_gemm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    scale_ptr,
    tile_expert_ptr,
    tile_start_ptr,
    tile_end_ptr,
    N,
    K,
    x_row_stride,
    w_expert_stride,
    w_row_stride,
    w_col_stride,
    out_row_stride,
    HAS_SCALE: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # One program: BLOCK_M rows of one expert times BLOCK_N output columns.
    tile = tl.program_id(0)
    column_block = tl.program_id(1)
    expert = tl.load(tile_expert_ptr + tile).to(tl.int64)
    start = tl.load(tile_start_ptr + tile).to(tl.int64)
    end = tl.load(tile_end_ptr + tile).to(tl.int64)
    rows = start + tl.arange(0, BLOCK_M)
    # A tile past the expert's rows (or past every expert's) has end <= rows: all masked.
    row_ok = rows < end
    cols = column_block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    w_base = w_ptr + expert * w_expert_stride
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(
            x_ptr + rows[:, None] * x_row_stride + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        # The weight tile read transposed: [BLOCK_K, BLOCK_N] of weight[e] [N, K] (row- or
        # column-major: the CPU lays experts out column-major, models/cpu_layout.py).
        b = tl.load(
            w_base + cols[None, :] * w_row_stride + ks[:, None] * w_col_stride,
            mask=k_ok[:, None] & col_ok[None, :],
            other=0.0,
        )
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if HAS_SCALE:
        scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        acc = acc * scale[:, None]
    tl.store(
        out_ptr + rows[:, None] * out_row_stride + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


def expert_tiles(counts: torch.Tensor, rows: int, block_m: int = BLOCK_M):
    """The tile plan for `rows` sorted rows owned by experts in `counts` [E]: three int64
    tensors of cdiv(rows, block_m) + E tiles, (expert, first row, end row) of each tile.
    Built with device ops only (no sync); unused tiles own no rows (start == end == 0)."""
    num_experts = counts.shape[0]
    counts = counts.to(torch.int64)
    ends = counts.cumsum(0)
    starts = ends - counts
    tiles = (counts + block_m - 1) // block_m
    tile_ends = tiles.cumsum(0)
    index = torch.arange(triton.cdiv(rows, block_m) + num_experts, device=counts.device)
    owner = torch.searchsorted(tile_ends, index, right=True)
    used = owner < num_experts
    expert = owner.clamp(max=num_experts - 1)
    first = starts[expert] + (index - (tile_ends[expert] - tiles[expert])) * block_m
    zero = torch.zeros_like(first)
    return expert, torch.where(used, first, zero), torch.where(used, ends[expert], zero)


def check_gemm_operands(x, weight, counts, row_scale) -> None:
    """ValueError unless x [M, K], weight [E, N, K] and counts [E] (and row_scale [M]) fit:
    same device, x and weight of one float dtype, rows of x contiguous (weight may have any
    strides)."""
    if x.dim() != 2 or weight.dim() != 3:
        raise ValueError(
            f"x must be [M, K] and weight [E, N, K], got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if x.shape[1] != weight.shape[2]:
        raise ValueError(f"x has K={x.shape[1]} but weight has K={weight.shape[2]}")
    if tuple(counts.shape) != (weight.shape[0],):
        raise ValueError(f"counts must be [{weight.shape[0]}], got {tuple(counts.shape)}")
    if x.dtype != weight.dtype or x.dtype not in GEMM_DTYPES:
        raise ValueError(f"x and weight must share one of {GEMM_DTYPES}: {x.dtype}, {weight.dtype}")
    if row_scale is not None and tuple(row_scale.shape) != (x.shape[0],):
        raise ValueError(f"row_scale must be [{x.shape[0]}], got {tuple(row_scale.shape)}")
    for name, tensor in (("weight", weight), ("counts", counts), ("row_scale", row_scale)):
        if tensor is not None and tensor.device != x.device:
            raise ValueError(f"{name} is on {tensor.device}, x on {x.device}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"rows of x must be contiguous, got strides {x.stride()}")


def grouped_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    counts: torch.Tensor,
    row_scale: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """[M, N] = each expert's rows of `x` [M, K] (sorted by expert, `counts` [E] of them
    each, summing to M) times that expert's `weight` [E, N, K] transposed, each row times
    `row_scale` [M] when given. The output has x's dtype; accumulation is in float32."""
    check_gemm_operands(x, weight, counts, row_scale)
    if resolve_backend("grouped_gemm", backend, x.device) == "torch":
        return grouped_gemm_torch(x, weight, counts, row_scale)
    rows, n = x.shape[0], weight.shape[1]
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows == 0 or n == 0:
        return out
    tile_expert, tile_start, tile_end = expert_tiles(counts, rows)
    block_n = min(max(triton.next_power_of_2(n), 16), MAX_BLOCK_N)
    block_k = min(max(triton.next_power_of_2(x.shape[1]), 16), MAX_BLOCK_K)
    grid = (tile_expert.shape[0], triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](
        x,
        weight,
        out,
        x if row_scale is None else row_scale,  # never read without HAS_SCALE
        tile_expert,
        tile_start,
        tile_end,
        n,
        x.shape[1],
        x.stride(0),
        weight.stride(0),
        weight.stride(1),
        weight.stride(2),
        out.stride(0),
        HAS_SCALE=row_scale is not None,
        PRECISION=dot_precision(x.dtype),
        UPCAST=upcast_dots(x.dtype),
        BLOCK_M=BLOCK_M,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    return out


def grouped_gemm_torch(x, weight, counts, row_scale=None) -> torch.Tensor:
    """The torch twin of the Triton kernel: one matmul per expert that owns rows (reading
    `counts` on the host, which syncs), float32 accumulation, the same epilogue."""
    out = torch.empty(x.shape[0], weight.shape[1], dtype=x.dtype, device=x.device)
    start = 0
    for expert, count in enumerate(counts.tolist()):
        span = slice(start, start + count)
        product = x[span].float() @ weight[expert].float().t()
        if row_scale is not None:
            product = product * row_scale[span].float()[:, None]
        out[span] = product.to(x.dtype)
        start += count
    return out
