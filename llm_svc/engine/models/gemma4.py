"""Gemma 4's text model: dense or with the MoE block, with or without per-layer embeddings
(config.py refuses bidirectional attention on every token by name). Tensor parallelism:
parallel/sharding.py (`_shard_gemma4`).

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
- Per-layer embeddings (PLE, the E models): every layer gets a slice of width P of
  `(norm(projection(embeds) / √hidden) + PLE(ids) · √P) / √2`, computed once per step from
  the embeddings after any image scatter (an image row projects its own row, and reads
  the table at `pad_token_id`, as transformers' Gemma4Model does), and
  gated into the residual after the MLP: per_layer_input_gate, the activation, times the
  slice, per_layer_projection, post_per_layer_input_norm.
- The MoE block (`enable_moe_block`, the 26B-A4B): beside each layer's dense MLP, a routed
  expert block reading the residual from before the MLP (its own pre-norm, post-norms on
  both branches, summed before post_feedforward_layernorm). The router (`Gemma4Router`)
  is Gemma's own; the experts are Iris's shared `Experts` (grouped path, fused kernel,
  FP8 experts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llm_svc.engine.attention.base import AttentionBackend
from llm_svc.engine.models.config import FULL, SLIDING, TextModelConfig
from llm_svc.engine.models.decoder import DecoderLM, SampledRows
from llm_svc.engine.models.layers import ACTIVATIONS, GatedMLP, RotaryEmbedding, apply_rotary
from llm_svc.engine.models.moe import Experts


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

    # Image spans attend both ways on sliding layers only (transformers'
    # create_masks_for_vision_model): a full layer stays causal.
    causal_on_full = True

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
        causal = self.causal_on_full and self.window is None
        out = backend.forward(self.layer, q, k, v, scale=1.0, window=self.window, causal=causal)
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class Gemma4Router(nn.Module):
    """Top-k of a softmax over `proj`(x̂ · `scale` / √hidden) in float32, x̂ the residual
    normed without a weight; the k weights renormalised to sum to 1, then each times its
    expert's `per_expert_scale`. Returns (weights [T, k] in x's dtype, experts [T, k])."""

    def __init__(self, config: TextModelConfig) -> None:
        super().__init__()
        hidden, moe = config.hidden_size, config.moe
        self.norm = Gemma4RMSNorm(hidden, config.rms_norm_eps, scaled=False)
        self.proj = nn.Linear(hidden, moe.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(moe.num_experts))
        self.top_k, self.root = moe.top_k, float(hidden) ** -0.5

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # The same order of operations as transformers (norm, · scale, · root), so that
        # near-tied experts are ranked the same way.
        scores = self.proj(self.norm(x) * self.scale * self.root)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32)
        weights, experts = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights * self.per_expert_scale[experts]
        return weights.to(x.dtype), experts


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
        self.moe = config.moe is not None
        if self.moe:
            moe, act = config.moe, config.hidden_act
            self.router = Gemma4Router(config)
            self.experts = Experts(moe.num_experts, hidden, moe.intermediate_size, act)
            self.post_feedforward_layernorm_1 = Gemma4RMSNorm(hidden, eps)
            self.pre_feedforward_layernorm_2 = Gemma4RMSNorm(hidden, eps)
            self.post_feedforward_layernorm_2 = Gemma4RMSNorm(hidden, eps)
        # A tensor-parallel RankGroup (parallel/sharding.py): the experts' partial output is
        # all-reduced before its post-norm, which needs the whole sum.
        self.group = None
        self.per_layer_input_size = config.per_layer_input_size
        if self.per_layer_input_size:
            self.act = ACTIVATIONS[config.hidden_act]
            self.per_layer_input_gate = nn.Linear(hidden, self.per_layer_input_size, bias=False)
            self.per_layer_projection = nn.Linear(self.per_layer_input_size, hidden, bias=False)
            self.post_per_layer_input_norm = Gemma4RMSNorm(hidden, eps)

    def forward(self, x, cos, sin, backend: AttentionBackend, per_layer_input=None):
        """`per_layer_input` [T, P]: this layer's PLE slice (None without PLE)."""
        attn = self.self_attn(self.input_layernorm(x), cos, sin, backend)
        x = x + self.post_attention_layernorm(attn)
        out = self.mlp(self.pre_feedforward_layernorm(x))
        if self.moe:
            # Both branches read x, the residual from before the MLP.
            weights, experts = self.router(x)
            routed = self.experts(self.pre_feedforward_layernorm_2(x), weights, experts)
            if self.group is not None:
                routed = self.group.all_reduce(routed)
            out = self.post_feedforward_layernorm_1(out)
            out = out + self.post_feedforward_layernorm_2(routed)
        x = x + self.post_feedforward_layernorm(out)
        if self.per_layer_input_size:
            gated = self.act(self.per_layer_input_gate(x)) * per_layer_input
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(gated))
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
        self.per_layer_input_size = width = config.per_layer_input_size
        if width:
            layers_width = config.num_layers * width
            self.embed_tokens_per_layer = nn.Embedding(config.per_layer_vocab_size, layers_width)
            self.per_layer_model_projection = nn.Linear(
                config.hidden_size, layers_width, bias=False
            )
            self.per_layer_projection_norm = Gemma4RMSNorm(width, config.rms_norm_eps)

    def per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """[T, layers, P]: each row's PLE slices. `embeds` are the rows as the first layer
        reads them (after any image scatter); `input_ids` pick the table rows (a caller
        with images passes pad_token_id at their positions, as transformers does)."""
        rows, layers, width = embeds.shape[0], len(self.layers), self.per_layer_input_size
        # Scaled as transformers scales each part: the projection by a Python float, the
        # table rows by √P cast to their dtype (Gemma4TextScaledWordEmbedding).
        projected = self.per_layer_model_projection(embeds) * float(self.config.hidden_size) ** -0.5
        projected = self.per_layer_projection_norm(projected.view(rows, layers, width))
        table = self.embed_tokens_per_layer(input_ids)
        table = table * torch.tensor(float(width) ** 0.5, dtype=table.dtype)
        return (projected + table.view(rows, layers, width)) * 2.0**-0.5

    def _table_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The ids the per-layer table reads: an image row (a sentinel id past the
        vocabulary) reads `pad_token_id`'s, as transformers' Gemma4Model does."""
        pad = input_ids.new_full((1,), self.config.pad_token_id)
        return torch.where(input_ids >= self.config.vocab_size, pad, input_ids)

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
        per_layer = None
        if self.per_layer_input_size:
            ids = input_ids if input_embeds is None else self._table_ids(input_ids)
            per_layer = self.per_layer_inputs(ids, x)
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
                if per_layer is not None:
                    per_layer = per_layer[sampled.rows]
            cos, sin = ropes[kind]
            x = layer(x, cos, sin, backend, None if per_layer is None else per_layer[:, index])
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
