"""Mixture-of-experts MLP: a top-k softmax router over gated experts (Qwen3-MoE,
Qwen2-MoE, and the Qwen3-VL-MoE decoder built on them).

Experts are held stacked, in HF's internal layout: `experts.gate_up_proj` [E, 2I, H] (gate
rows first, then up) and `experts.down_proj` [E, H, I]; llm_svc/engine/models/
expert_weights.py reads them from either checkpoint layout. The forward is grouped: the
routed (token, expert) pairs are sorted by expert, and each expert runs once, on exactly
the tokens routed to it, never on every token. Two paths compute that:
- fused (CUDA): two launches of the grouped GEMM kernel (iris_kernels/grouped_gemm.py), one for
  every expert's gate/up over its contiguous slice of the sorted rows, one for every
  expert's down projection with the routing weight in its epilogue; no host sync;
- grouped (the CPU, and FP8 experts everywhere): a host loop, one `run_expert` per expert
  that has rows.
FP8 experts (`Fp8Experts`, llm_svc/engine/models/quantization.py) keep their weights in
FP8 and dequantize one expert's blocks at its use.

Tensor parallelism (llm_svc/engine/parallel/sharding.py) shards every expert's
intermediate dimension and the shared expert's like a dense MLP, keeps the router whole,
and sets `group`: the block's partial output (routed + shared) is all-reduced once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from iris_kernels.grouped_gemm import grouped_gemm
from llm_svc.engine.models.config import MoeConfig
from llm_svc.engine.models.layers import ACTIVATIONS, GatedMLP


class Router(nn.Module):
    """`weight` [E, H]: softmax over all experts (in fp32), top-k, optionally renormalised
    (`norm_topk_prob`). Returns (weights [T, k] in x's dtype, experts [T, k])."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, norm_topk_prob: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = F.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts


class Experts(nn.Module):
    """E gated experts, stacked: expert e computes down_e(act(gate_e(x)) * up_e(x)).

    `fused`: None runs the fused kernels on CUDA and the grouped loop elsewhere; True or
    False forces one (True on a CPU tensor needs TRITON_INTERPRET=1, as tests run it)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.num_experts, self.intermediate = num_experts, intermediate
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.act = ACTIVATIONS[act]
        self.fused: bool | None = None

    def expert_weights(self, expert: int, dtype: torch.dtype):
        """Expert `expert`'s (gate_up [2I, H], down [H, I]) in `dtype`."""
        return self.gate_up_proj[expert].to(dtype), self.down_proj[expert].to(dtype)

    def run_expert(self, expert: int, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Expert `expert` on rows `x` [n, H] (flat token indices `tokens` [n], which the
        MoE test uses to check that only routed tokens reach an expert)."""
        gate_up, down = self.expert_weights(expert, x.dtype)
        gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
        return F.linear(self.act(gate) * up, down)

    def uses_fused(self, x: torch.Tensor) -> bool:
        if self.fused is None:
            return x.device.type == "cuda"
        return self.fused

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor):
        """x [T, H], weights/experts [T, k] → Σ_k weight · expert(x) [T, H]."""
        if self.uses_fused(x):
            return self.forward_fused(x, weights, experts)
        return self.forward_grouped(x, weights, experts)

    def sort_by_expert(self, experts: torch.Tensor):
        """The (token, expert) pairs of `experts` [T, k] sorted by expert: (order [T·k], the
        pairs' flat indices; tokens [T·k], their tokens; counts [E], pairs per expert).

        Device ops whose output sizes the host knows, so the fused path never waits for the
        device: `torch.bincount`'s size depends on the largest id, which CUDA reads back."""
        flat = experts.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.zeros(self.num_experts, dtype=torch.int64, device=flat.device)
        counts.index_add_(0, flat, torch.ones_like(flat))
        return order, order // experts.shape[1], counts

    def forward_fused(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor):
        """The fused path: the rows sorted by expert, then two grouped GEMM launches."""
        order, tokens, counts = self.sort_by_expert(experts)
        rows = x.index_select(0, tokens)
        backend = "triton"  # forced: the CPU reaches here only under the interpreter
        gate, up = grouped_gemm(rows, self.gate_up_proj, counts, backend=backend).chunk(2, -1)
        hidden = (self.act(gate) * up).contiguous()
        scale = weights.reshape(-1).index_select(0, order)
        down = grouped_gemm(hidden, self.down_proj, counts, scale, backend=backend)
        return torch.zeros_like(x).index_add_(0, tokens, down)

    def forward_grouped(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor):
        """The grouped path: one `run_expert` per expert that has rows (a host loop)."""
        order, tokens, counts = self.sort_by_expert(experts)
        rows, scale = x.index_select(0, tokens), weights.reshape(-1, 1).index_select(0, order)
        outputs, start = [], 0
        # One host read of the per-expert counts: the loop runs on the host.
        for expert, count in enumerate(counts.tolist()):
            if count:
                span = slice(start, start + count)
                outputs.append(self.run_expert(expert, tokens[span], rows[span]) * scale[span])
                start += count
        out = torch.zeros_like(x)
        if outputs:
            out.index_add_(0, tokens, torch.cat(outputs))
        return out


class SparseMoE(nn.Module):
    """The MoE MLP block: `gate` (the router), `experts`, and, with
    `config.shared_expert_size`, Qwen2-MoE's `shared_expert` scaled by
    sigmoid(`shared_expert_gate`(x)) and added."""

    def __init__(self, hidden: int, config: MoeConfig, act: str = "silu") -> None:
        super().__init__()
        self.gate = Router(hidden, config.num_experts, config.top_k, config.norm_topk_prob)
        self.experts = Experts(config.num_experts, hidden, config.intermediate_size, act)
        self.shared_expert = self.shared_expert_gate = None
        if config.shared_expert_size:
            self.shared_expert = GatedMLP(hidden, config.shared_expert_size, act)
            self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)
        self.group = None  # a tensor-parallel RankGroup: all-reduce the partial output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.gate(x)
        out = self.experts(x, weights, experts)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        if self.group is not None:
            out = self.group.all_reduce(out)
        return out
