"""Extend (prefill chunk) attention over the paged KV cache, every chunk of a step at once.

A chunk is the last `q_len` positions of a sequence's `context`: its queries attend to the
cached prefix and causally to the chunk itself (or, given `attend_until`, up to the end of
the image span a query sits in). The caller has already stored the chunk's
K/V in the cache, so both parts are read the same way, through the block table. One launch
covers all chunks: the host cuts each chunk into query blocks of BLOCK_M rows and lists
them (chunk, first row), so ragged chunk lengths cost no padding beyond one partial block.
Grid: (query block, query head).

The torch twin is the SDPA attention backend (llm_svc/engine/attention/sdpa.py).
"""

from __future__ import annotations

import math

import torch
import triton.language as tl

from iris_kernels.attention_tile import attend_tile, empty_state
from iris_kernels.backend import jit, resolve_backend
from iris_kernels.paged_attention_decode import (
    LOG2E,
    check_operands,
    dot_precision,
    upcast_dots,
)


def extend_tiles(head_dim: int) -> tuple[int, int]:
    """(BLOCK_M query rows, BLOCK_N key positions) per tile for a head dim."""
    if head_dim <= 64:
        return 64, 64
    return (64, 32) if head_dim <= 128 else (32, 32)


MAX_COMBINE = None  # bound per mode by `jit` (iris_kernels/backend.py)


@jit(max_combine="MAX_COMBINE")
def _extend_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    tables_ptr,
    chunks_ptr,
    blocks_ptr,
    until_ptr,
    num_chunks,
    num_blocks,
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_UNTIL: tl.constexpr,
):
    block = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    # Blocks: two int32 columns (chunk, first row). Chunks: four (flat start, query
    # length, context length, block-table row).
    chunk = tl.load(blocks_ptr + block)
    first = tl.load(blocks_ptr + num_blocks + block)
    q_start = tl.load(chunks_ptr + chunk).to(tl.int64)
    q_len = tl.load(chunks_ptr + num_chunks + chunk)
    context = tl.load(chunks_ptr + 2 * num_chunks + chunk)
    row = tl.load(chunks_ptr + 3 * num_chunks + chunk).to(tl.int64)
    prefix = context - q_len

    rows = first + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len
    dims = tl.arange(0, HEAD_DIM)
    q_offsets = (q_start + rows)[:, None] * q_stride_t + head * q_stride_h + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    own = prefix + rows  # each query row's position
    last = own  # the last position each query row may see (causal)
    if HAS_UNTIL:
        # Inside an image span that attends both ways, up to the span's last position.
        until = tl.load(until_ptr + q_start + rows, mask=row_ok, other=0)
        last = tl.maximum(own, until)

    acc, top, total = empty_state(BLOCK_M, HEAD_DIM)
    table = tables_ptr + row * table_stride
    k_head = k_ptr + kv_head * kv_stride_h
    v_head = v_ptr + kv_head * kv_stride_h
    # Positions past the block's last row are never visible to it. Without a window,
    # position 0 is visible to every row. With window W, row r sees (last_r - W, last_r];
    # the loop starts at the block's first row's first visible position.
    end = tl.minimum(context, prefix + first + BLOCK_M)
    if HAS_UNTIL:
        end = tl.minimum(context, tl.reduce(last, 0, MAX_COMBINE) + 1)
    lo = 0
    if window > 0:
        lo = tl.maximum(prefix + first - window + 1, 0)
    for tile in range(lo, end, BLOCK_N):
        pos = tile + tl.arange(0, BLOCK_N)
        in_context = pos < end
        visible = in_context[None, :] & (pos[None, :] <= last[:, None])
        if window > 0:
            visible = visible & (pos[None, :] > own[:, None] - window)
        acc, top, total = attend_tile(
            acc, top, total, q, pos, in_context, visible, table, k_head, v_head,
            kv_stride_s, scale_log2, PAGE, HEAD_DIM, PRECISION, UPCAST,
        )  # fmt: skip

    result = acc / tl.where(total > 0, total, 1.0)[:, None]  # padding rows may see nothing
    o_offsets = (q_start + rows)[:, None] * o_stride_t + head * o_stride_h + dims[None, :]
    tl.store(out_ptr + o_offsets, result.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def paged_extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    block_tables: torch.Tensor,
    chunks: torch.Tensor,
    blocks: torch.Tensor,
    num_chunks: int,
    num_blocks: int,
    page_size: int,
    *,
    scale: float | None = None,
    window: int | None = None,
    attend_until: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attend every chunk's queries to its prefix and causally to itself; writes `out` rows.
    `scale`: the softmax scale (None: D ** -0.5); `window` W: a query at q sees only the
    keys at k with q - k < W (a sliding-window layer). `attend_until` [T] (int64, per flat
    token): the last position each query sees when past itself (an image span that attends
    both ways); the window still applies, from the query's own position.

    q and out [T, H, D]; k_cache / v_cache [slots, KVH, D] (one layer, the chunks' own K/V
    already stored); block_tables [rows, max_pages] int64. On the device, int32: `chunks`
    [4 * num_chunks] = flat starts, query lengths, context lengths, block-table rows;
    `blocks` [2 * num_blocks] = each query block's chunk, then its first row, blocks of
    `extend_tiles(D)[0]` rows (see `query_blocks`).
    """
    check_operands(q, k_cache, v_cache)
    resolve_backend("paged_extend_attention", "triton", q.device)
    if num_blocks == 0:
        return out
    num_heads, (kv_heads, head_dim) = q.shape[1], k_cache.shape[1:]
    block_m, block_n = extend_tiles(head_dim)
    _extend_kernel[(num_blocks, num_heads)](
        q, k_cache, v_cache, out, block_tables, chunks, blocks,
        attend_until if attend_until is not None else chunks, num_chunks, num_blocks,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
        LOG2E * (scale if scale is not None else 1.0 / math.sqrt(head_dim)), window or 0,
        GROUP=num_heads // kv_heads, PAGE=page_size, HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION=dot_precision(q.dtype), UPCAST=upcast_dots(q.dtype),
        HAS_UNTIL=attend_until is not None,
    )  # fmt: skip
    return out


def query_blocks(query_lens: list[int], head_dim: int) -> tuple[list[int], list[int]]:
    """Host-side block list for `paged_extend_attention`: (chunk of each block, first row)."""
    block_m = extend_tiles(head_dim)[0]
    owners, firsts = [], []
    for chunk, query_len in enumerate(query_lens):
        for first in range(0, query_len, block_m):
            owners.append(chunk)
            firsts.append(first)
    return owners, firsts
