"""Mixture of experts: each expert runs once per layer and step, on exactly the tokens
routed to it; experts load from the per-expert and the stacked (Qwen3-VL-MoE) layouts; the
fused forward never makes the host wait for the device."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import iris_kernels
from llm_svc.engine.models.moe import Experts, SparseMoE
from tests.llm_svc.conftest import greedy, make_engine, run_all, token_ids
from tests.llm_svc.family_checkpoints import family_checkpoint, stacked_experts_copy
from tests.llm_svc.test_families import LONG, HFGreedy

MOE_ARCHS = ["qwen3_moe", "qwen2_moe"]
# Every MoE family: the two above, the hybrid Qwen3.5-MoE and Qwen3-VL-MoE's decoder.
_MORE_MOE_FAMILIES = {
    "qwen3_5_moe": "tiny_qwen3_5_moe_dir",
    "qwen3_vl_moe": "tiny_qwen3_vl_moe_dir",
}
# Ops after which the host waits for the device on CUDA: an output whose size depends on
# the data (the host must learn it to allocate), or a value read back.
HOST_READS = {
    "aten::bincount",
    "aten::nonzero",
    "aten::masked_select",
    "aten::_local_scalar_dense",
    "aten::repeat_interleave",
}


@pytest.fixture(scope="module", params=MOE_ARCHS)
def moe_dir(request):
    return family_checkpoint(request.param)


@pytest.fixture(params=[*MOE_ARCHS, *_MORE_MOE_FAMILIES])
def any_moe_dir(request):
    fixture = _MORE_MOE_FAMILIES.get(request.param)
    return request.getfixturevalue(fixture) if fixture else family_checkpoint(request.param)


class HostReads(TorchDispatchMode):
    """Records into `seen` each op of HOST_READS (and `unique` in any form) that runs
    inside it, and counts every op in `ops`. (On a CPU tensor `.tolist()` and `.numpy()`
    dispatch no op, so those reads are left to review; `.item()` and `bool()` are seen.)"""

    def __init__(self, seen: list[str]) -> None:
        super().__init__()
        self.seen, self.ops = seen, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().partition(".")[0]  # any overload
        if name in HOST_READS or name.startswith(("aten::unique", "aten::_unique")):
            self.seen.append(name)
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_the_fused_forward_never_waits_for_the_device(any_moe_dir, monkeypatch):
    """A prefill and one decode step with every MoE block on the fused path, its Triton
    kernel interpreted (the kernel's torch twin reads the counts on the host, so it is not
    the CUDA path). Only the blocks are watched: sampling reads the ids on purpose."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    engine = make_engine(any_moe_dir)
    blocks = [m for m in engine.runner.model.modules() if isinstance(m, SparseMoE)]
    assert blocks
    for block in blocks:
        block.experts.fused = True
    seen: list[str] = []
    rows, ops = [], []
    forward = SparseMoE.forward

    def watched(self, x):
        rows.append(x.shape[0])
        with HostReads(seen) as reads:
            out = forward(self, x)
        ops.append(reads.ops)
        return out

    monkeypatch.setattr(SparseMoE, "forward", watched)
    launches = iris_kernels.CALLS[("grouped_gemm", "triton")]
    run_all(engine, {"r": (list(range(20, 31)), greedy(2))})
    engine.close()
    assert rows.count(1) == len(blocks), "one decode step, one row, through every block"
    assert iris_kernels.CALLS[("grouped_gemm", "triton")] - launches == 2 * len(rows)
    assert min(ops) > 0 and seen == []


def test_each_expert_runs_once_on_exactly_its_routed_tokens(moe_dir, monkeypatch):
    engine = make_engine(moe_dir, max_num_batched_tokens=16)
    blocks = [m for m in engine.runner.model.modules() if isinstance(m, SparseMoE)]
    assert blocks
    routed: dict[int, torch.Tensor] = {}  # id(experts module) → its call's [T, k] choices
    ran: dict[int, set[int]] = {}  # id(experts module) → the experts run in its call
    calls = []
    original_forward, original_run = Experts.forward, Experts.run_expert

    def forward(self, x, weights, experts):
        routed[id(self)], ran[id(self)] = experts, set()
        return original_forward(self, x, weights, experts)

    def run_expert(self, expert, tokens, x):
        calls.append(expert)
        assert expert not in ran[id(self)], f"expert {expert} ran twice in one call"
        ran[id(self)].add(expert)
        expected = (routed[id(self)] == expert).any(dim=1).nonzero().flatten().tolist()
        assert sorted(tokens.tolist()) == expected, f"expert {expert} ran on unrouted tokens"
        return original_run(self, expert, tokens, x)

    monkeypatch.setattr(Experts, "forward", forward)
    monkeypatch.setattr(Experts, "run_expert", run_expert)
    ids = engine.tokenizer(LONG)["input_ids"]
    run_all(engine, {"r": (ids, greedy(4))})
    assert len(calls) > len(blocks)
    engine.close()


def test_both_stacked_expert_layouts_load_the_same_model(moe_dir, tmp_path_factory):
    published = stacked_experts_copy(moe_dir, tmp_path_factory.mktemp("published") / "model")
    internal = stacked_experts_copy(
        moe_dir, tmp_path_factory.mktemp("internal") / "model", transposed=False
    )
    reference = HFGreedy()
    ids = make_engine(moe_dir).tokenizer(LONG)["input_ids"]
    expected, _ = reference(moe_dir, ids, 6)
    for model_dir in (moe_dir, published, internal):
        engine = make_engine(model_dir)
        assert token_ids(run_all(engine, {"r": (ids, greedy(6))})["r"]) == expected
        engine.close()
