"""The engine's MoE block on its fused path (the grouped GEMM kernel, interpreted) equals
its grouped path (the host loop the CPU serves with), on a routing that leaves experts
empty."""

import torch

from llm_svc.engine.models.config import MoeConfig
from llm_svc.engine.models.moe import SparseMoE


def _block(shared: int) -> SparseMoE:
    config = MoeConfig(
        num_experts=6, top_k=2, intermediate_size=24, norm_topk_prob=True,
        shared_expert_size=shared,
    )  # fmt: skip
    block = SparseMoE(40, config)
    generator = torch.Generator().manual_seed(shared)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return block


def test_fused_path_equals_grouped_path(runs_on):
    for shared in (0, 16):
        block = _block(shared)
        x = torch.randn(19, 40, generator=torch.Generator().manual_seed(7))
        block.experts.fused = False
        grouped = block(x)
        block.experts.fused = True
        with runs_on("grouped_gemm", "triton", times=2):
            fused = block(x)
        torch.testing.assert_close(fused, grouped, rtol=1e-5, atol=1e-5)


def test_fused_experts_with_empty_experts_equal_grouped(runs_on):
    """A routing (built here, not by the router) that leaves experts 1, 4 and 5 empty."""
    experts = _block(0).experts
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(21, 40, generator=generator)
    used = torch.tensor([0, 2, 3])
    chosen = torch.stack([used[torch.randperm(3, generator=generator)[:2]] for _ in range(21)])
    weights = torch.rand(21, 2, generator=generator)
    experts.fused = False
    grouped = experts(x, weights, chosen)
    experts.fused = True
    with runs_on("grouped_gemm", "triton", times=2):
        fused = experts(x, weights, chosen)
    torch.testing.assert_close(fused, grouped, rtol=1e-5, atol=1e-5)
