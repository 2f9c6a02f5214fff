"""The decoder-only language model skeleton every family shares: embedding, a stack of
family-built layers, final norm, LM head, and one rotary embedding per layer kind.

A family module (llm_svc/engine/models/<family>.py) builds the layers from the blocks in
layers.py and hands them here; parameter names mirror the HF checkpoints
(`embed_tokens`, `layers.N.self_attn.q_proj`, ...) so weights load by name once the
checkpoint's prefix is stripped.

A layer is called as layer(x [T, H], cos, sin, backend) → [T, H], with the cos/sin of its
kind's rotary embedding (`config.layer_type(i)`). With deepstack (Qwen3-VL), level i of
the step's image rows is added to the hidden states after layer i.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from iris_kernels import scatter_add_rows
from llm_svc.engine.attention.base import AttentionBackend, AttentionMetadata
from llm_svc.engine.models.config import FULL, SLIDING, TextModelConfig
from llm_svc.engine.models.layers import RMSNorm, RotaryEmbedding


@dataclass(frozen=True)
class DeepstackRows:
    """A step's deepstack input: `levels[i]` [R, hidden] is added to packed rows `rows`
    (int64 [R], distinct) after decoder layer i. Only the rows of the step's chunks are
    here, so a chunk that cuts an image adds exactly its part of every level."""

    rows: torch.Tensor
    levels: list[torch.Tensor]


@dataclass(frozen=True)
class SampledRows:
    """The rows a step samples: `rows` [N] their flat indices, and `meta` the step with
    only them as queries (AttentionMetadata.last_tokens). A model that
    `keeps_sampled_rows` takes it and returns only those rows' hidden states."""

    rows: torch.Tensor
    meta: AttentionMetadata


class DecoderLM(nn.Module):
    """forward(ids, positions, backend[, input_embeds]) → hidden [T, H]; then
    compute_logits(hidden rows to sample) → fp32 logits [N, vocab].

    `norm` is the final norm's class; `embed_scale` multiplies the embeddings (Gemma's
    √hidden, rounded to the weights' dtype as HF does)."""

    # True for a model whose forward takes `sampled` (SampledRows) and returns only those
    # rows (Gemma 4: its KV-shared layers need no other row).
    keeps_sampled_rows = False

    def __init__(
        self,
        config: TextModelConfig,
        layers: list[nn.Module],
        *,
        norm: type[nn.Module] = RMSNorm,
        embed_scale: float | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.embed_scale = embed_scale
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = norm(config.hidden_size, config.rms_norm_eps)
        self.layer_kinds = [config.layer_type(i) for i in range(config.num_layers)]
        full, local = config.rope(FULL), config.rope(SLIDING)
        self.rotary = RotaryEmbedding(
            config.head_dim, full.theta, config.mrope_section, full.linear_factor,
            mrope_interleaved=config.mrope_interleaved,
        )  # fmt: skip
        # Layers whose kind has the same rope share one cos/sin table per step.
        self.local_rotary = None
        if local != full and SLIDING in self.layer_kinds:
            self.local_rotary = RotaryEmbedding(
                config.head_dim, local.theta, None, local.linear_factor
            )
        self.lm_head = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.embed_tokens(input_ids)
        if self.embed_scale is not None:
            rows = rows * torch.tensor(self.embed_scale, dtype=rows.dtype)
        return rows

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        backend: AttentionBackend,
        input_embeds: torch.Tensor | None = None,
        deepstack: DeepstackRows | None = None,
    ) -> torch.Tensor:
        """`input_embeds` [T, H], when given, replaces the embedding of `input_ids` (the
        multimodal path scatters image rows into it before calling); `deepstack` levels
        are added after their layers."""
        x = self.embed(input_ids) if input_embeds is None else input_embeds
        ropes = {FULL: self.rotary(positions, x.dtype)}
        ropes[SLIDING] = ropes[FULL]
        if self.local_rotary is not None:
            ropes[SLIDING] = self.local_rotary(positions, x.dtype)
        levels = deepstack.levels if deepstack is not None else ()
        for index, (layer, kind) in enumerate(zip(self.layers, self.layer_kinds, strict=True)):
            cos, sin = ropes[kind]
            x = layer(x, cos, sin, backend)
            if index < len(levels):
                x = scatter_add_rows(x.contiguous(), levels[index].to(x.dtype), deepstack.rows)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return (hidden @ weight.T).float()
