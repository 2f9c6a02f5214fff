"""Qwen3-VL's language model (dense and MoE): Qwen3 layers (per-head RMSNorm on q and k
before RoPE, no q/k/v bias), interleaved M-RoPE, and deepstack: after decoder layer i
(i < levels) the step's image rows get deepstack level i added (`scatter_add_rows`).

Written on the engine's Llama / Qwen2 decoder (decoder.py); the Qwen3 and MoE blocks of
the decoder families' rework can replace `Qwen3Attention` and `SparseMoE` once merged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernels import scatter_add_rows
from llm_svc.engine.attention.base import AttentionBackend
from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.models.decoder import Attention, DecoderLayer, DecoderLM
from llm_svc.engine.models.layers import RMSNorm, RotaryEmbedding, apply_rotary


@dataclass(frozen=True)
class DeepstackRows:
    """A step's deepstack input: `levels[i]` [R, hidden] is added to packed rows `rows`
    (host int64 [R], distinct) after decoder layer i."""

    rows: torch.Tensor
    levels: list[torch.Tensor]


def interleaved_rotary(config: TextModelConfig) -> RotaryEmbedding:
    """M-RoPE whose frequency band j reads row h when j % 3 == 1 and j < 3 * section[1],
    row w when j % 3 == 2 and j < 3 * section[2], else row t (transformers' Qwen3-VL)."""
    section = config.mrope_section
    rotary = RotaryEmbedding(config.head_dim, config.rope_theta, section)
    rows = []
    for band in range(config.head_dim // 2):
        row = band % 3 if band % 3 and band < 3 * section[band % 3] else 0
        rows.append(row)
    rotary.section_of = torch.tensor(rows, device=rotary.inv_freq.device)
    return rotary


def rotary_for(config: TextModelConfig) -> RotaryEmbedding:
    """The rotary embedding a decoder of `config` uses (fp32, computed, never loaded)."""
    if config.mrope_interleaved:
        return interleaved_rotary(config)
    return RotaryEmbedding(config.head_dim, config.rope_theta, config.mrope_section)


class Qwen3Attention(Attention):
    """Attention with RMSNorm over each head's q and k (weights `q_norm`, `k_norm`)."""

    def __init__(self, config: TextModelConfig, layer: int) -> None:
        super().__init__(config, layer)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, backend: AttentionBackend) -> torch.Tensor:
        tokens = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(tokens, -1, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(tokens, -1, self.head_dim))
        v = self.v_proj(x).view(tokens, -1, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = backend.forward(self.layer, q, k, v)
        return self.o_proj(out.reshape(tokens, -1))


class SparseMoE(nn.Module):
    """Top-k of `experts` gated MLPs per token, weights renormalised over the k (Qwen3-VL-
    MoE). Expert tensors as transformers holds them: `experts.gate_up_proj` [E, 2I, H]
    (gate rows first), `experts.down_proj` [E, H, I]; the router is `gate.weight` [E, H]."""

    def __init__(self, hidden: int, experts: int, top_k: int, intermediate: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.Module()
        self.experts.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * intermediate, hidden))
        self.experts.down_proj = nn.Parameter(torch.empty(experts, hidden, intermediate))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        # Host loop over the experts this step routes to (one sync per step for the set).
        for expert in chosen.unique().tolist():
            token, slot = torch.where(chosen == expert)
            gate, up = F.linear(x[token], self.experts.gate_up_proj[expert]).chunk(2, dim=-1)
            rows = F.linear(F.silu(gate) * up, self.experts.down_proj[expert])
            out.index_add_(0, token, rows * weights[token, slot, None])
        return out


class Qwen3VLDecoderLayer(DecoderLayer):
    def __init__(self, config: TextModelConfig, layer: int) -> None:
        super().__init__(config, layer)
        self.self_attn = Qwen3Attention(config, layer)
        if config.moe is not None:
            experts, top_k, width, step, dense = config.moe
            if layer not in dense and (layer + 1) % step == 0:
                self.mlp = SparseMoE(config.hidden_size, experts, top_k, width)


class Qwen3VLDecoder(DecoderLM):
    """forward(ids, positions, backend[, input_embeds, deepstack]) → hidden [T, H]."""

    def __init__(self, config: TextModelConfig) -> None:
        super().__init__(config)
        self.layers = nn.ModuleList(
            Qwen3VLDecoderLayer(config, i) for i in range(config.num_layers)
        )
        self.rotary = rotary_for(config)
        if config.deepstack_levels > config.num_layers:
            raise ValueError(
                f"{config.deepstack_levels} deepstack levels for {config.num_layers} layers"
            )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        backend: AttentionBackend,
        input_embeds: torch.Tensor | None = None,
        deepstack: DeepstackRows | None = None,
    ) -> torch.Tensor:
        x = self.embed(input_ids) if input_embeds is None else input_embeds
        cos, sin = self.rotary(positions, x.dtype)
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, backend)
            if deepstack is not None and index < len(deepstack.levels):
                # Only this step's image rows: a chunk that cuts an image adds its part.
                level = deepstack.levels[index].to(x.dtype)
                x = scatter_add_rows(x.contiguous(), level, deepstack.rows)
        return self.norm(x)
