"""Qwen2-MoE: Qwen2's layers (q/k/v bias from `qkv_bias`, no q/k norm) with the experts
plus a shared expert behind a sigmoid gate (`MoeConfig.shared_expert_size`); the same
router fields as Qwen3-MoE."""

from __future__ import annotations

from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.models.decoder import DecoderLM
from llm_svc.engine.models.layers import PreNormDecoderLayer
from llm_svc.engine.models.llama import attention
from llm_svc.engine.models.qwen3_moe import moe_or_dense


def build(config: TextModelConfig) -> DecoderLM:
    layers = [
        PreNormDecoderLayer(
            attention(config, i), moe_or_dense(config, i), config.hidden_size, config.rms_norm_eps
        )
        for i in range(config.num_layers)
    ]
    return DecoderLM(config, layers)
