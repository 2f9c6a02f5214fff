"""Mixture of experts: each expert runs once per layer and step, on exactly the tokens
routed to it; experts load from the per-expert and the stacked (Qwen3-VL-MoE) layouts."""

from __future__ import annotations

import pytest
import torch

from llm_svc.engine.models.moe import Experts, SparseMoE
from tests.llm_svc.conftest import greedy, make_engine, run_all, token_ids
from tests.llm_svc.family_checkpoints import family_checkpoint, stacked_experts_copy
from tests.llm_svc.test_families import LONG, HFGreedy

MOE_ARCHS = ["qwen3_moe", "qwen2_moe"]


@pytest.fixture(scope="module", params=MOE_ARCHS)
def moe_dir(request):
    return family_checkpoint(request.param)


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
