"""Qwen3-MoE: Qwen3's layers with a top-k mixture of experts as the MLP of the sparse
layers (`MoeConfig.is_sparse`: `decoder_sparse_step`, `mlp_only_layers`), the dense MLP
elsewhere; `norm_topk_prob` decides whether the top-k weights are renormalised."""

from __future__ import annotations

from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.models.decoder import DecoderLM
from llm_svc.engine.models.layers import GatedMLP
from llm_svc.engine.models.moe import SparseMoE
from llm_svc.engine.models.qwen3 import qwen3_layer


def moe_or_dense(config: TextModelConfig, layer: int):
    """Layer `layer`'s MLP: the experts where the config makes it sparse, else dense."""
    if config.moe is not None and config.moe.is_sparse(layer):
        return SparseMoE(config.hidden_size, config.moe, config.hidden_act)
    return GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)


def build(config: TextModelConfig) -> DecoderLM:
    layers = [qwen3_layer(config, i, moe_or_dense(config, i)) for i in range(config.num_layers)]
    return DecoderLM(config, layers)
