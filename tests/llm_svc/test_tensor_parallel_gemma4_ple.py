"""Tensor parallelism (gloo, two CPU ranks) for Gemma 4 with per-layer embeddings and
KV-shared layers (gemma4_text_ple): the full layers' one KV head replicated, the sliding
layers' two split, the KV-shared layers run on the sampled rows on every rank (the other
ranks rebuild each sample row's chunk from the step). TP 2 gives TP 1's greedy tokens and
log-probs, as test_tensor_parallel_gemma4.py checks the MoE variant."""

from __future__ import annotations

from llm_svc.engine.models.config import TextModelConfig
from tests.llm_svc.family_checkpoints import family_checkpoint
from tests.llm_svc.test_tensor_parallel_gemma4 import check_tp2_equals_tp1, tp1_and_tp2


def test_tp2_equals_tp1_with_per_layer_embeddings_and_kv_shared_layers():
    model_dir = family_checkpoint("gemma4_text_ple")
    mc = TextModelConfig.from_model_dir(model_dir)
    assert mc.per_layer_input_size and mc.kv_sources
    check_tp2_equals_tp1(tp1_and_tp2(model_dir), "gemma4_text_ple")
