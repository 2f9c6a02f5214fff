"""Llama, Mistral and Qwen2 (and the language models of Idefics3 and Qwen2-VL): pre-norm
layers, dense SwiGLU MLP; Qwen2 adds q/k/v biases, Qwen2-VL M-RoPE, Mistral a sliding
window on every layer (all read from the config)."""

from __future__ import annotations

from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.models.decoder import DecoderLM
from llm_svc.engine.models.layers import Attention, GatedMLP, PreNormDecoderLayer


def attention(config: TextModelConfig, layer: int, **options) -> Attention:
    """Layer `layer`'s attention with the config's heads, bias and window."""
    return Attention(
        layer, config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
        bias=config.attention_bias, norm_eps=config.rms_norm_eps, window=config.window(layer),
        **options,
    )  # fmt: skip


def build(config: TextModelConfig) -> DecoderLM:
    layers = [
        PreNormDecoderLayer(
            attention(config, i),
            GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act),
            config.hidden_size,
            config.rms_norm_eps,
        )
        for i in range(config.num_layers)
    ]
    return DecoderLM(config, layers)
