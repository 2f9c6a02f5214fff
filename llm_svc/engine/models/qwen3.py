"""Qwen3 (dense): Llama's layer with per-head RMSNorm on q and k before RoPE, and no q/k/v
bias. The language model of Qwen3-VL builds on `qwen3_layer`."""

from __future__ import annotations

from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.models.decoder import DecoderLM
from llm_svc.engine.models.layers import GatedMLP, PreNormDecoderLayer, RMSNorm
from llm_svc.engine.models.llama import attention


def qwen3_layer(config: TextModelConfig, layer: int, mlp=None) -> PreNormDecoderLayer:
    """One Qwen3 layer; `mlp` replaces the dense MLP (Qwen3-MoE passes its experts)."""
    if mlp is None:
        mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
    return PreNormDecoderLayer(
        attention(config, layer, qk_norm=RMSNorm), mlp, config.hidden_size, config.rms_norm_eps
    )


def build(config: TextModelConfig) -> DecoderLM:
    return DecoderLM(config, [qwen3_layer(config, i) for i in range(config.num_layers)])
