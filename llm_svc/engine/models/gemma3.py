"""Gemma 3's text model: sandwich-norm layers ((1 + w) RMSNorm before and after both
attention and MLP), q/k norms, softmax scale query_pre_attn_scalar ** -0.5, the
gelu_pytorch_tanh gated MLP, embeddings scaled by √hidden, and sliding-window layers with
their own rope theta (global layers may use linear rope scaling; see config.read_ropes)."""

from __future__ import annotations

from torch import nn

from llm_svc.engine.attention.base import AttentionBackend
from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.models.decoder import DecoderLM
from llm_svc.engine.models.layers import GatedMLP, GemmaRMSNorm
from llm_svc.engine.models.llama import attention


class SandwichDecoderLayer(nn.Module):
    """x + post_attention_layernorm(attn(input_layernorm(x))), then
    x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))."""

    def __init__(self, config: TextModelConfig, layer: int) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        scalar = config.query_pre_attn_scalar or config.head_dim
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.self_attn = attention(config, layer, qk_norm=GemmaRMSNorm, scale=scalar**-0.5)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.mlp = GatedMLP(hidden, config.intermediate_size, config.hidden_act)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def forward(self, x, cos, sin, backend: AttentionBackend):
        attn = self.self_attn(self.input_layernorm(x), cos, sin, backend)
        x = x + self.post_attention_layernorm(attn)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


def build(config: TextModelConfig) -> DecoderLM:
    layers = [SandwichDecoderLayer(config, i) for i in range(config.num_layers)]
    return DecoderLM(
        config, layers, norm=GemmaRMSNorm, embed_scale=float(config.hidden_size) ** 0.5
    )
