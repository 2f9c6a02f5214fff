"""Decode attention straight from the paged KV cache: one query token per sequence.

K/V are read through the block table (slot = page * page_size + offset), never gathered into
a contiguous copy. One program handles one (sequence, kv head, split): the query heads that
share the kv head (GQA) are one tile, so each K/V tile is loaded once for the whole group.
Long contexts are cut into splits that run in parallel (split-K); each split leaves its
partial output and log-sum-exp, and a second kernel merges them. With one split the first
kernel writes the final output itself.

The torch twin is the SDPA attention backend (llm_svc/engine/attention/sdpa.py); the tests
compare the two. The launcher takes its sizes from the host (the scheduler's lengths), so it
never reads a device tensor back.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from iris_kernels.attention_tile import attend_tile, empty_state
from iris_kernels.backend import interpreting, jit, resolve_backend

# The dtypes and head dims the kernels are written for (head dims: powers of two, so a
# head is one tile with no masking, and at least 16, the smallest tl.dot operand).
ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HEAD_DIMS = (16, 32, 64, 128, 256)
MAX_SPLITS = 16
# A split covers at least this many positions: below it, the merge costs more than it saves.
MIN_SPLIT_TOKENS = 256
LOG2E = 1.4426950408889634

# Inside the kernels these names are the combiners for the mode they were built in (see
# iris_kernels.backend.jit); the module-level values are never used.
SUM_COMBINE = None
MAX_COMBINE = None


@jit
def _decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    tables_ptr,
    plan_ptr,
    num_seqs,
    num_heads,
    num_splits,
    split_len,
    q_stride_t,
    q_stride_h,
    o_stride_t,
    o_stride_h,
    kv_stride_s,
    kv_stride_h,
    table_stride,
    scale_log2,
    window,
    GROUP: tl.constexpr,
    PAGE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DIRECT: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # The plan holds three int32 columns: flat token, block-table row, context length.
    token = tl.load(plan_ptr + seq).to(tl.int64)
    row = tl.load(plan_ptr + num_seqs + seq).to(tl.int64)
    context = tl.load(plan_ptr + 2 * num_seqs + seq)
    start = split * split_len
    end = tl.minimum(start + split_len, context)

    lanes = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + lanes
    head_ok = lanes < GROUP  # BLOCK_H pads the group up to a tl.dot-sized tile
    dims = tl.arange(0, HEAD_DIM)
    q_offsets = token * q_stride_t + heads[:, None] * q_stride_h + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=head_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    # Online softmax in base 2 (scale_log2 folds log2(e) into the score scale).
    acc, top, total = empty_state(BLOCK_H, HEAD_DIM)
    table = tables_ptr + row * table_stride
    k_head = k_ptr + kv_head * kv_stride_h
    v_head = v_ptr + kv_head * kv_stride_h
    # Every tile the loop visits holds at least one position < end, so `top` turns finite
    # at the first tile. Every head of the group sees every position of its split from
    # `lo` on: the query (at context - 1) sees keys k with context - 1 - k < window.
    lo = start
    if window > 0:
        lo = tl.maximum(start, context - window)
    for tile in range(lo, end, BLOCK_N):
        pos = tile + tl.arange(0, BLOCK_N)
        valid = pos < end
        acc, top, total = attend_tile(
            acc, top, total, q, pos, valid, valid[None, :], table, k_head, v_head,
            kv_stride_s, scale_log2, PAGE, HEAD_DIM, PRECISION, UPCAST,
        )  # fmt: skip

    # A split past the end of a short context saw nothing: weight 0 in the merge.
    seen = total > 0
    result = acc / tl.where(seen, total, 1.0)[:, None]
    if DIRECT:
        o_offsets = token * o_stride_t + heads[:, None] * o_stride_h + dims[None, :]
        tl.store(out_ptr + o_offsets, result.to(out_ptr.dtype.element_ty), mask=head_ok[:, None])
    else:
        part = (seq * num_heads + heads) * num_splits + split  # [seqs, heads, splits] index
        lse = tl.where(seen, top + tl.log2(tl.where(seen, total, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=head_ok)
        p_offsets = part[:, None] * HEAD_DIM + dims[None, :]
        tl.store(part_out_ptr + p_offsets, result, mask=head_ok[:, None])


@jit(sum_combine="SUM_COMBINE", max_combine="MAX_COMBINE")
def _decode_merge_kernel(
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    plan_ptr,
    num_heads,
    num_splits,
    o_stride_t,
    o_stride_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    token = tl.load(plan_ptr + seq).to(tl.int64)
    splits = tl.arange(0, BLOCK_S)
    used = splits < num_splits
    part = (seq * num_heads + head) * num_splits + splits
    lse = tl.load(part_lse_ptr + part, mask=used, other=float("-inf"))
    # Split 0 always holds position 0, so the largest lse is finite.
    weight = tl.exp2(lse - tl.reduce(lse, 0, MAX_COMBINE))
    dims = tl.arange(0, HEAD_DIM)
    # Masked lanes must read as 0, not garbage: 0 * NaN would poison the sum.
    parts_offsets = part[:, None] * HEAD_DIM + dims[None, :]
    parts = tl.load(part_out_ptr + parts_offsets, mask=used[:, None], other=0.0)
    merged = tl.reduce(parts * weight[:, None], 0, SUM_COMBINE) / tl.reduce(weight, 0, SUM_COMBINE)
    o_offsets = token * o_stride_t + head * o_stride_h + dims
    tl.store(out_ptr + o_offsets, merged.to(out_ptr.dtype.element_ty))


def unsupported_reason(head_dim: int, dtype: torch.dtype) -> str | None:
    """Why the paged attention kernels cannot serve this head dim / dtype, or None."""
    if dtype not in ATTENTION_DTYPES:
        return f"dtype {dtype} is not one of {ATTENTION_DTYPES}"
    if head_dim not in HEAD_DIMS:
        return f"head dim {head_dim} is not one of {HEAD_DIMS}"
    return None


def check_operands(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Raise ValueError unless q [T, H, D] and the caches [slots, KVH, D] fit the kernels."""
    if q.dim() != 3 or k_cache.dim() != 3 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"expected q [T, H, D] and caches [slots, KVH, D], got {tuple(q.shape)}, "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    head_dim, kv_heads = k_cache.shape[2], k_cache.shape[1]
    reason = unsupported_reason(head_dim, k_cache.dtype)
    if reason:
        raise ValueError(reason)
    if q.shape[2] != head_dim or q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"q {q.dtype} {tuple(q.shape)} does not match the cache's")
    if q.shape[1] % kv_heads:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {kv_heads} kv heads")
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if tensor.stride(2) != 1:
            raise ValueError(f"{name} heads must be contiguous, got strides {tensor.stride()}")


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 caches are for exactness (CPU parity, tests): no TF32 rounding in the dots.
    return "ieee" if dtype == torch.float32 or upcast_dots(dtype) else "tf32"


def upcast_dots(dtype: torch.dtype) -> bool:
    # Triton 3.7's interpreter multiplies bf16 tiles as raw 16-bit integers (tl.dot gives
    # garbage), so interpreted bf16 runs its dots in fp32; compiled kernels use bf16 dots.
    return dtype == torch.bfloat16 and interpreting()


def split_plan(max_context: int, min_split_tokens: int) -> tuple[int, int]:
    """(splits, positions per split, a multiple of 16) for the longest context."""
    splits = max(1, min(MAX_SPLITS, max_context // max(min_split_tokens, 1)))
    split_len = triton.cdiv(triton.cdiv(max_context, splits), 16) * 16
    return triton.cdiv(max_context, split_len), split_len


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    block_tables: torch.Tensor,
    plan: torch.Tensor,
    num_seqs: int,
    max_context: int,
    page_size: int,
    *,
    min_split_tokens: int | None = None,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Attend `num_seqs` single-token queries to their paged contexts; writes `out` rows.
    `scale` is the softmax scale (None: D ** -0.5); with `window` W the query sees only the
    last W positions of its context (a sliding-window layer).

    q and out [T, H, D]; k_cache / v_cache [slots, KVH, D] (one layer); block_tables
    [rows, max_pages] int64; plan int32 [3 * num_seqs] on the device: the flat tokens, then
    the block-table rows, then the context lengths (>= 1, each including its query).
    `max_context` (a host int, at least the longest context) sizes the split-K grid:
    splits of at least `min_split_tokens` positions (default MIN_SPLIT_TOKENS).
    """
    check_operands(q, k_cache, v_cache)
    resolve_backend("paged_decode_attention", "triton", q.device)
    if num_seqs == 0:
        return out
    num_heads, (kv_heads, head_dim) = q.shape[1], k_cache.shape[1:]
    group = num_heads // kv_heads
    block_n = 64 if head_dim <= 128 else 32
    splits, split_len = split_plan(max_context, min_split_tokens or MIN_SPLIT_TOKENS)
    direct = splits == 1
    part_out = part_lse = out  # unused placeholders when one split writes `out` directly
    if not direct:
        part_out = torch.empty(
            num_seqs, num_heads, splits, head_dim, dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(num_seqs, num_heads, splits, dtype=torch.float32, device=q.device)
    _decode_split_kernel[(num_seqs, kv_heads, splits)](
        q, k_cache, v_cache, out, part_out, part_lse, block_tables, plan,
        num_seqs, num_heads, splits, split_len,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
        LOG2E * (scale if scale is not None else 1.0 / math.sqrt(head_dim)), window or 0,
        GROUP=group, PAGE=page_size, HEAD_DIM=head_dim,
        BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n,
        DIRECT=direct, PRECISION=dot_precision(q.dtype), UPCAST=upcast_dots(q.dtype),
    )  # fmt: skip
    if not direct:
        _decode_merge_kernel[(num_seqs, num_heads)](
            out, part_out, part_lse, plan, num_heads, splits, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_S=triton.next_power_of_2(splits),
        )  # fmt: skip
    return out
