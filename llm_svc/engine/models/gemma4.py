"""Gemma 4's text model, part 1: dense, without per-layer embeddings (config.py refuses
those, the MoE block, and bidirectional attention on every token, by name).

Its quirks, all here:
- Layers of two shapes: full-attention layers have their own head_dim and KV heads
  (`per_layer_config`, read into `config.kv_shape`), and rotate only a fraction of their
  dims (proportional rope); sliding layers use the default rope, each kind its own theta.
- `attention_k_eq_v`: full layers have no v_proj; the value is k_proj's raw output through
  v_norm, while the key gets k_norm and the rope.
- Every layer that computes KV norms its values (v_norm, an RMS norm without a weight);
  queries and keys are normed per head; the softmax scale is 1.0.
- KV-shared layers (`config.kv_source`): the last `num_kv_shared_layers` layers attend to
  the KV of the last earlier layer of their kind and compute none (no k/v projections),
  and with `use_double_wide_mlp` their MLP is twice as wide. Writing no KV, they feed
  only the sampled rows: from the first of them on, only those rows are computed (as
  transformers' `_maybe_slice_kv_shared_inputs` does in generate).
- Norms are weight·x̂ (not Gemma 3's (1 + w)), in fp32; each layer's output is multiplied
  by its `layer_scalar`; embeddings are scaled by √hidden; the tied head's logits are
  soft-capped (`final_logit_softcapping`) when set.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llm_svc.engine.attention.base import AttentionBackend
from llm_svc.engine.models.config import FULL, SLIDING, TextModelConfig
from llm_svc.engine.models.decoder import DecoderLM, SampledRows
from llm_svc.engine.models.layers import GatedMLP, RotaryEmbedding, apply_rotary


class Gemma4RMSNorm(nn.Module):
    """x̂ · weight (weight initialised to ones), or x̂ alone with `scaled` False; computed in
    fp32 and cast back once."""

    def __init__(self, size: int, eps: float, scaled: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size)) if scaled else None
        self.size, self.eps = size, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        return F.rms_norm(x.float(), (self.size,), weight, self.eps).to(x.dtype)


class Gemma4Attention(nn.Module):
    """One layer's attention. A layer that reuses KV has only q_proj, q_norm and o_proj:
    the backend reads its source layer's pages (k and v passed as None)."""

    def __init__(self, config: TextModelConfig, layer: int) -> None:
        super().__init__()
        kind = config.layer_type(layer)
        shape = config.kv_shape(kind)
        hidden, eps, bias = config.hidden_size, config.rms_norm_eps, config.attention_bias
        self.layer, self.window = layer, config.window(layer)
        self.num_heads, self.num_kv_heads = config.num_heads, shape.num_kv_heads
        self.head_dim = shape.head_dim
        self.reads_shared = config.kv_source(layer) != layer
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.q_norm = Gemma4RMSNorm(self.head_dim, eps)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        if self.reads_shared:
            return
        kv_width = self.num_kv_heads * self.head_dim
        self.k_proj = nn.Linear(hidden, kv_width, bias=bias)
        self.k_norm = Gemma4RMSNorm(self.head_dim, eps)
        self.v_norm = Gemma4RMSNorm(self.head_dim, eps, scaled=False)
        self.v_proj = None
        if not (config.attention_k_eq_v and kind == FULL):
            self.v_proj = nn.Linear(hidden, kv_width, bias=bias)

    def forward(self, x, cos, sin, backend: AttentionBackend) -> torch.Tensor:
        tokens = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(tokens, self.num_heads, self.head_dim))
        q = apply_rotary(q, cos, sin)
        k = v = None
        if not self.reads_shared:
            raw = self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
            v = raw if self.v_proj is None else self.v_proj(x).view(raw.shape)
            k = apply_rotary(self.k_norm(raw), cos, sin)
            v = self.v_norm(v)
        out = backend.forward(self.layer, q, k, v, scale=1.0, window=self.window)
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class Gemma4DecoderLayer(nn.Module):
    """Gemma's sandwich norms around attention and MLP, then the whole output times
    `layer_scalar` (a stored [1] weight)."""

    def __init__(self, config: TextModelConfig, layer: int) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        width = config.intermediate_size
        if config.double_wide_mlp and config.kv_source(layer) != layer:
            width *= 2
        self.input_layernorm = Gemma4RMSNorm(hidden, eps)
        self.self_attn = Gemma4Attention(config, layer)
        self.post_attention_layernorm = Gemma4RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = Gemma4RMSNorm(hidden, eps)
        self.mlp = GatedMLP(hidden, width, config.hidden_act)
        self.post_feedforward_layernorm = Gemma4RMSNorm(hidden, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1))

    def forward(self, x, cos, sin, backend: AttentionBackend):
        attn = self.self_attn(self.input_layernorm(x), cos, sin, backend)
        x = x + self.post_attention_layernorm(attn)
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x * self.layer_scalar


class Gemma4LM(DecoderLM):
    """DecoderLM with one rope per layer kind at that kind's head_dim, soft-capped logits,
    and the KV-shared layers run on the sampled rows only (`keeps_sampled_rows`)."""

    keeps_sampled_rows = True

    def __init__(self, config: TextModelConfig, layers: list[nn.Module]) -> None:
        super().__init__(
            config, layers, norm=Gemma4RMSNorm, embed_scale=float(config.hidden_size) ** 0.5
        )
        full, local = config.rope(FULL), config.rope(SLIDING)
        self.rotary = RotaryEmbedding(
            config.kv_shape(FULL).head_dim, full.theta, None, full.linear_factor,
            rotated=full.rotated,
        )  # fmt: skip
        self.local_rotary = RotaryEmbedding(
            config.kv_shape(SLIDING).head_dim, local.theta, None, local.linear_factor,
            rotated=local.rotated,
        )  # fmt: skip
        self.softcap = config.final_logit_softcapping
        shared = [i for i in range(config.num_layers) if config.kv_source(i) != i]
        self.first_shared = shared[0] if shared else config.num_layers

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        backend: AttentionBackend,
        input_embeds: torch.Tensor | None = None,
        sampled: SampledRows | None = None,
    ) -> torch.Tensor:
        """Hidden states [T, H], or with `sampled` only those rows' [N, H]: the layers
        before the first KV-shared one run on every row (they write the KV), the rest on
        the sampled rows, attending as one query each (`sampled.meta`)."""
        x = self.embed(input_ids) if input_embeds is None else input_embeds
        ropes = {
            FULL: self.rotary(positions, x.dtype),
            SLIDING: self.local_rotary(positions, x.dtype),
        }
        for index, (layer, kind) in enumerate(zip(self.layers, self.layer_kinds, strict=True)):
            if index == self.first_shared and sampled is not None:
                if not sampled.meta.query_lens:  # no row samples: nothing more to compute
                    x = x[:0]
                    break
                x, ropes = self._sampled_only(x, ropes, sampled, backend)
            cos, sin = ropes[kind]
            x = layer(x, cos, sin, backend)
        if self.first_shared == len(self.layers) and sampled is not None:
            x = x[sampled.rows]
        return self.norm(x)

    @staticmethod
    def _sampled_only(x, ropes, sampled: SampledRows, backend: AttentionBackend):
        """The sampled rows of x and of each rope, with `backend` planned for them."""
        backend.plan(sampled.meta)
        rows = sampled.rows
        return x[rows], {kind: (cos[rows], sin[rows]) for kind, (cos, sin) in ropes.items()}

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def build(config: TextModelConfig) -> DecoderLM:
    return Gemma4LM(config, [Gemma4DecoderLayer(config, i) for i in range(config.num_layers)])
