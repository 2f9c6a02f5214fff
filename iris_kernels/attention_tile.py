"""The step that both paged attention kernels (decode and extend) take for each K/V tile.

A program holds a tile of query rows (decode: the query heads of one kv head; extend: a
block of one head's queries) and walks the context BLOCK_N positions at a time, reading K
and V through the block table and folding each tile into an online softmax in base 2.
"""

from __future__ import annotations

import triton.language as tl

from iris_kernels.backend import device_function

# Inside the function these names are the combiners for the mode it was built in (see
# iris_kernels.backend.device_function); the module-level values are never used.
SUM_COMBINE = None
MAX_COMBINE = None


@device_function
def empty_state(ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The (acc, top, total) of `attend_tile` before the first tile, for ROWS query rows."""
    acc = tl.full([ROWS, HEAD_DIM], 0.0, tl.float32)
    top = tl.full([ROWS], float("-inf"), tl.float32)
    total = tl.full([ROWS], 0.0, tl.float32)
    return acc, top, total


@device_function(sum_combine="SUM_COMBINE", max_combine="MAX_COMBINE")
def attend_tile(
    acc,
    top,
    total,
    q,
    pos,
    valid,
    visible,
    table,
    k_head,
    v_head,
    kv_stride_s,
    scale_log2,
    PAGE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Fold the K/V positions `pos` [BLOCK_N] into the running (acc, top, total).

    q [rows, HEAD_DIM]; acc [rows, HEAD_DIM], top and total [rows]: the unnormalised output,
    the running maximum score (base 2) and the running sum of exp2(score - top). `valid`
    [BLOCK_N] says which positions exist (the others are not read); `visible` ([rows,
    BLOCK_N] or broadcastable) which positions each row attends to, within `valid`.
    `table` points at the sequence's block-table row, `k_head` / `v_head` at the kv head in
    the caches. Returns the new (acc, top, total).
    """
    page = tl.load(table + pos // PAGE, mask=valid, other=0)
    slots = page * PAGE + pos % PAGE
    kv_offsets = slots[:, None] * kv_stride_s + tl.arange(0, HEAD_DIM)[None, :]
    k = tl.load(k_head + kv_offsets, mask=valid[:, None], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    scores = tl.where(visible, scores, float("-inf"))
    # A row that sees nothing in a tile keeps its state (alpha = 1, p = 0) once its `top`
    # is finite. A row that has seen nothing yet (a sliding window starting past this
    # tile) would compute exp2(-inf - -inf) = NaN: it subtracts 0 instead and stays empty.
    new_top = tl.maximum(top, tl.reduce(scores, 1, MAX_COMBINE))
    shift = tl.where(new_top == float("-inf"), 0.0, new_top)
    alpha = tl.exp2(top - shift)
    p = tl.exp2(scores - shift[:, None])
    total = total * alpha + tl.reduce(p, 1, SUM_COMBINE)
    v = tl.load(v_head + kv_offsets, mask=valid[:, None], other=0.0)
    if UPCAST:
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, new_top, total
