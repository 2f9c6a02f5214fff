"""Tensor parallelism (gloo, two CPU ranks) for Gemma 4's MoE variant: one global KV head on
its full layers (fewer than the ranks: replicated) with keys equal values, two KV heads on
its sliding layers (split), the MoE block beside every dense MLP (experts split, the router
whole). TP 2 gives TP 1's greedy tokens and log-probs through chunked prefill, a
prefix-cache hit, preemption and a JSON-constrained request; the router's choices (recorded
on rank 0) may differ only at near-ties of the top-k boundary (tp_compare.py). The variant
with per-layer embeddings and KV-shared layers: test_tensor_parallel_gemma4_ple.py."""

from __future__ import annotations

import pytest
import torch

from llm_svc.engine import EngineConfig, LLMEngine
from llm_svc.engine.models.config import FULL, SLIDING, TextModelConfig
from llm_svc.engine.models.gemma4 import Gemma4Router
from tests.llm_svc.family_checkpoints import family_checkpoint
from tests.llm_svc.test_families import LONG, SHORT
from tests.llm_svc.test_tensor_parallel_families import CHUNK, PAGE, _params, _run
from tests.llm_svc.tp_compare import compare_routers, compare_runs


@pytest.fixture(scope="module")
def runs():
    model_dir = family_checkpoint("gemma4_text_moe")
    mc = TextModelConfig.from_model_dir(model_dir)
    assert mc.kv_shape(FULL).num_kv_heads == 1 and mc.kv_shape(SLIDING).num_kv_heads == 2
    assert mc.attention_k_eq_v and mc.moe is not None
    return tp1_and_tp2(model_dir)


def tp1_and_tp2(model_dir) -> dict:
    """{size: (first run, the long prompt again, router decisions, stats)} at TP 1 and 2."""
    decisions: list = []
    original = Gemma4Router.forward

    def recording(self, x):
        weights, experts = original(self, x)
        scores = self.proj(self.norm(x) * self.scale * self.root)
        top = torch.softmax(scores.float(), dim=-1).topk(self.top_k + 1, dim=-1).values
        decisions.append((experts.sort(dim=-1).values, (top[:, -2] - top[:, -1]).tolist()))
        return weights, experts

    Gemma4Router.forward = recording
    results = {}
    try:
        for size in (1, 2):
            config = EngineConfig(
                model_dir, page_size=PAGE, max_num_batched_tokens=CHUNK, num_pages=20,
                max_num_seqs=4, dtype="float32", device="cpu", tensor_parallel_size=size,
            )  # fmt: skip
            engine = LLMEngine(config)
            try:
                engine.grammars.submit(_params()[1].constraint).result(timeout=120)
                ids = [engine.tokenizer(text)["input_ids"] for text in (LONG, SHORT, LONG)]
                batch = list(zip([ids[0], ids[1], ids[2][2:]], _params(), strict=True))
                decisions.clear()
                first = _run(engine, batch)
                again = _run(engine, batch[:1])
                results[size] = (first, again, list(decisions), engine.stats())
            finally:
                engine.close()
    finally:
        Gemma4Router.forward = original
    return results


def check_tp2_equals_tp1(runs, arch: str) -> list:
    """Compare the runs (asserting); returns TP 1's router decisions."""
    first1, again1, routers1, stats1 = runs[1]
    first2, again2, routers2, stats2 = runs[2]
    flips = compare_runs(first1, first2, arch) + compare_runs(again1, again2, f"{arch} again")
    router_flips = compare_routers(routers1, routers2, arch)
    print(f"\n{arch}: {len(flips)} near-tie flip(s), {len(router_flips)} router flip(s)")
    assert stats1.preemptions > 0 and stats2.preemptions > 0
    assert again1[0].cached > 0 and again2[0].cached > 0
    return routers1


def test_tp2_equals_tp1_on_the_moe_variant(runs):
    assert check_tp2_equals_tp1(runs, "gemma4_text_moe")
