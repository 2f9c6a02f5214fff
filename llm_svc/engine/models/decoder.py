"""A compact decoder-only language model over a paged KV cache (Llama / Qwen2 family).

Parameter names mirror the HF checkpoints (`embed_tokens`, `layers.N.self_attn.q_proj`, ...)
so weights load by name once the checkpoint's prefix is stripped.
"""

from __future__ import annotations

import torch
from torch import nn

from llm_svc.engine.attention.base import AttentionBackend
from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.models.layers import GatedMLP, RMSNorm, RotaryEmbedding, apply_rotary


class Attention(nn.Module):
    def __init__(self, config: TextModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)

    def forward(self, x, cos, sin, backend: AttentionBackend) -> torch.Tensor:
        tokens = x.shape[0]
        q = self.q_proj(x).view(tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = backend.forward(self.layer, q, k, v)
        return self.o_proj(out.reshape(tokens, -1))


class DecoderLayer(nn.Module):
    def __init__(self, config: TextModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)

    def forward(self, x, cos, sin, backend: AttentionBackend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderLM(nn.Module):
    """forward(ids, positions, backend[, input_embeds]) → hidden [T, H]; then
    compute_logits(hidden rows to sample) → fp32 logits [N, vocab]."""

    def __init__(self, config: TextModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.mrope_section)
        self.lm_head = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        backend: AttentionBackend,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`input_embeds` [T, H], when given, replaces the embedding of `input_ids` (the
        multimodal path scatters image rows into it before calling)."""
        x = self.embed(input_ids) if input_embeds is None else input_embeds
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, backend)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return (hidden @ weight.T).float()
