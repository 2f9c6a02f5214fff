"""Weight layouts for the CPU's float32 GEMM.

nn.Linear stores a weight [N, K] row-major and multiplies x [M, K] by its transpose. On the
CPU, torch's float32 matmul (MKL sgemm) is slow on that "transposed B" case for the row
counts a decode step has: against the same weight stored column-major (the memory of a
row-major [K, N]), it took 1.1-2.8x as long for 4 <= M <= 128 rows and about as long at
M = 512, but 0.8x as long at M = 2 and 3 (`python bench/cpu_gemm.py` measures it, by the
demo model's shapes and M). A decode batch spends few steps at 2 or 3 rows, so one layout
serves every M: the column-major one.

So, on the CPU in float32, every weight the model multiplies by is allocated column-major
before loading: the same shape [N, K], the same values, strides (1, N). `F.linear` then
hands MKL an untransposed operand. Loading copies into the parameter (`copy_` honours its
strides), and tensor parallelism cuts its slices from the checkpoint's tensors, so neither
sees the difference. What is laid out so:
- every linear layer's weight (nn.Linear, the tensor-parallel column/row layers and LM
  head, the MoE router);
- the embedding table when the LM head is tied to it (the logits multiply by it; its
  lookups become strided reads, a few milliseconds on a 512-token chunk);
- stacked experts [E, N, K]: each expert's [N, K] column-major, strides (N·K, 1, N).

bf16 and fp16 go through oneDNN, which is faster on the row-major layout, and FP8 layers
have their own kernels: both are left as they are.
"""

from __future__ import annotations

import torch
from torch import nn


def column_major(param: nn.Parameter) -> None:
    """Re-stride a not-yet-allocated (meta) parameter so that each trailing [N, K] matrix
    is column-major; `materialize` keeps the strides (`empty_like` preserves them)."""
    if param.device.type != "meta":
        raise ValueError(f"only a meta parameter can be re-laid out, got {param.device}")
    shape = tuple(param.shape)
    n, k = shape[-2:]
    strides = (1, n) if len(shape) == 2 else (n * k, 1, n)
    param.data = torch.empty_strided(shape, strides, dtype=param.dtype, device="meta")


def gemm_weights(model: nn.Module) -> list[nn.Parameter]:
    """The float32 parameters `model` multiplies activations by (see the module doc)."""
    from llm_svc.engine.models.moe import Experts, Router
    from llm_svc.engine.parallel.layers import (
        ColumnParallelLinear,
        ParallelLMHead,
        RowParallelLinear,
    )

    linear = (nn.Linear, ColumnParallelLinear, RowParallelLinear, ParallelLMHead, Router)
    found: list[nn.Parameter] = []
    for module in model.modules():
        if isinstance(module, linear):
            found.append(module.weight)
        elif type(module) is Experts:  # FP8 experts (a subclass) keep their own layout
            found.extend((module.gate_up_proj, module.down_proj))
    if getattr(model, "lm_head", None) is None and hasattr(model, "embed_tokens"):
        found.append(model.embed_tokens.weight)  # the tied LM head
    return [param for param in found if param.dtype == torch.float32 and param.dim() in (2, 3)]


def lay_out_for_cpu(model: nn.Module) -> int:
    """Make `model`'s (meta) float32 GEMM weights column-major; returns how many."""
    params = gemm_weights(model)
    for param in params:
        column_major(param)
    return len(params)
