"""Qwen3.5's language model (`Qwen3_5ForCausalLM`, and the decoder of
`Qwen3_5ForConditionalGeneration`): hybrid, three Gated DeltaNet layers to one gated
full-attention layer. Qwen3.5-MoE (family qwen3_5_moe) has the same layers with the MoE
block of llm_svc/engine/models/moe.py as every layer's MLP (top-k experts plus a shared
expert behind a sigmoid gate).

Full attention: the query projection packs a gate beside each head's query (per head
[query | gate]), q/k are RMS-normed per head, RoPE turns only the first
`partial_rotary_factor` of each head, and the output is multiplied by sigmoid(gate).
Linear attention: llm_svc/engine/models/gated_deltanet.py, over per-sequence states held in
the engine's StatePool (llm_svc/engine/state_pool.py), read and written in place. Every norm
but the linear layers' gated one scales by (1 + weight) (GemmaRMSNorm). Parameter names
mirror the HF checkpoint; its `mtp.*` weights (multi-token prediction) are loaded apart,
by the MTP drafter (llm_svc/engine/spec/mtp.py), only when it drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llm_svc.engine.attention.base import AttentionBackend
from llm_svc.engine.models.config import LINEAR, TextModelConfig
from llm_svc.engine.models.gated_deltanet import (
    TORCH,
    RuleKernels,
    causal_conv1d,
    causal_conv1d_step,
)
from llm_svc.engine.models.layers import GatedMLP, GemmaRMSNorm, RotaryEmbedding, apply_rotary
from llm_svc.engine.models.moe import SparseMoE


@dataclass
class StepStates:
    """Where each sequence of a packed step keeps its linear-attention state: sequence i
    owns flat tokens [starts[i], starts[i] + lens[i]) and state slot slots[i] of `pool`.
    The layers split them into decodes (one token) and prefills (more), `split` once per
    step: index tensors on the pool's device, shared by every layer."""

    pool: object  # llm_svc.engine.state_pool.StatePool
    starts: list[int]
    lens: list[int]
    slots: list[int]
    kernels: RuleKernels = TORCH

    def __post_init__(self) -> None:
        device = self.pool.recurrent.device
        decode = [i for i, length in enumerate(self.lens) if length == 1]
        prefill = [i for i, length in enumerate(self.lens) if length > 1]
        self.decode_rows = self._index([self.starts[i] for i in decode], device)
        self.decode_slots = self._index([self.slots[i] for i in decode], device)
        rows = [r for i in prefill for r in range(self.starts[i], self.starts[i] + self.lens[i])]
        self.prefill_rows = self._index(rows, device)
        self.prefill_slots = self._index([self.slots[i] for i in prefill], device)
        # (flat start, length, slot) of each prefill, host ints for the conv's loop.
        self.prefills = [(self.starts[i], self.lens[i], self.slots[i]) for i in prefill]

    @staticmethod
    def _index(values: list[int], device) -> torch.Tensor | None:
        if not values:
            return None
        return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


class GatedRMSNorm(nn.Module):
    """RMSNorm (plain weight) of the rule's output, then times silu(gate)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        normed = self.weight * x32.to(x.dtype)
        return (normed * F.silu(gate.float())).to(x.dtype)


class GatedAttention(nn.Module):
    def __init__(self, config: TextModelConfig, kv_layer: int) -> None:
        super().__init__()
        self.kv_layer = kv_layer  # its index among the layers that keep KV pages
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim, self.rotary_dim = config.head_dim, config.rotary_dim
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim * 2, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)

    def _rotate(self, x, cos, sin):
        turned = apply_rotary(x[..., : self.rotary_dim], cos, sin)
        return torch.cat([turned, x[..., self.rotary_dim :]], dim=-1)

    def forward(self, x, cos, sin, backend: AttentionBackend) -> torch.Tensor:
        tokens = x.shape[0]
        packed = self.q_proj(x).view(tokens, self.num_heads, 2 * self.head_dim)
        q, gate = packed.chunk(2, dim=-1)
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        out = backend.forward(self.kv_layer, q, k, v).reshape(tokens, -1)
        return self.o_proj(out * torch.sigmoid(gate.reshape(tokens, -1)))


class GatedDeltaNet(nn.Module):
    def __init__(self, config: TextModelConfig, state_layer: int) -> None:
        super().__init__()
        shape = config.linear
        self.state_layer = state_layer  # its index among the linear layers (in the pool)
        self.hk, self.hv = shape.num_key_heads, shape.num_value_heads
        self.dk, self.dv = shape.key_head_dim, shape.value_head_dim
        hidden, channels = config.hidden_size, shape.conv_channels
        self.in_proj_qkv = nn.Linear(hidden, channels, bias=False)
        self.in_proj_z = nn.Linear(hidden, self.hv * self.dv, bias=False)
        self.in_proj_b = nn.Linear(hidden, self.hv, bias=False)
        self.in_proj_a = nn.Linear(hidden, self.hv, bias=False)
        self.conv1d = nn.Conv1d(channels, channels, shape.conv_kernel, groups=channels, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.hv * self.dv, hidden, bias=False)

    def forward(self, x: torch.Tensor, states: StepStates) -> torch.Tensor:
        tokens = x.shape[0]
        mixed = self.in_proj_qkv(x)
        # Decay in log space, in fp32 (a bf16 exp(A_log) could overflow).
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        beta = torch.sigmoid(self.in_proj_b(x))
        core = torch.empty(tokens, self.hv, self.dv, dtype=x.dtype, device=x.device)
        conv_states = states.pool.conv[self.state_layer]
        rule_states = states.pool.recurrent[self.state_layer]
        weight = self.conv1d.weight[:, 0, :]
        if states.decode_rows is not None:  # every one-token sequence at once
            rows, slots = states.decode_rows, states.decode_slots
            step = causal_conv1d_step(mixed[rows], conv_states[slots], weight)
            conv_out, conv_states[slots] = step
            q, k, v = self._heads(conv_out, len(rows), 1)
            out, rule_states[slots] = states.kernels.recurrent(
                q, k, v, g[rows, None], beta[rows, None], rule_states[slots]
            )
            core[rows] = out[:, 0]
        if states.prefill_rows is not None:  # packed one after another
            conv_outs = []
            for start, length, slot in states.prefills:
                rows = slice(start, start + length)
                conv_out, conv_states[slot] = causal_conv1d(mixed[rows], conv_states[slot], weight)
                conv_outs.append(conv_out)
            rows, slots = states.prefill_rows, states.prefill_slots
            q, k, v = self._heads(torch.cat(conv_outs), 1, len(rows))
            lens = [length for _, length, _ in states.prefills]
            out, rule_states[slots] = states.kernels.chunk(
                q, k, v, g[None, rows], beta[None, rows], rule_states[slots], lens
            )
            core[rows] = out[0]
        z = self.in_proj_z(x).view(tokens, self.hv, self.dv)
        return self.out_proj(self.norm(core, z).reshape(tokens, -1))

    def _heads(self, conv_out: torch.Tensor, batch: int, length: int):
        """[batch * length, channels] → q/k [batch, length, Hk, dk], v [.., Hv, dv]."""
        keys = self.hk * self.dk
        q, k, v = conv_out.split([keys, keys, self.hv * self.dv], -1)
        return (
            q.reshape(batch, length, self.hk, self.dk),
            k.reshape(batch, length, self.hk, self.dk),
            v.reshape(batch, length, self.hv, self.dv),
        )


class HybridLayer(nn.Module):
    def __init__(self, config: TextModelConfig, layer: int, index: int) -> None:
        super().__init__()
        self.linear = config.layer_types[layer] == LINEAR
        if self.linear:
            self.linear_attn = GatedDeltaNet(config, index)
        else:
            self.self_attn = GatedAttention(config, index)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.moe is not None:  # Qwen3.5-MoE: every layer sparse
            self.mlp = SparseMoE(config.hidden_size, config.moe, config.hidden_act)
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)

    def forward(self, x, cos, sin, backend, states: StepStates) -> torch.Tensor:
        normed = self.input_layernorm(x)
        if self.linear:
            x = x + self.linear_attn(normed, states)
        else:
            x = x + self.self_attn(normed, cos, sin, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3_5LM(nn.Module):
    """The DecoderLM interface, plus the step's `states` (StepStates) for the linear layers."""

    def __init__(self, config: TextModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        counters = dict.fromkeys(config.layer_types, 0)
        layers = []
        for layer, kind in enumerate(config.layer_types):
            layers.append(HybridLayer(config, layer, counters[kind]))
            counters[kind] += 1
        self.layers = nn.ModuleList(layers)
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        # The VLM: interleaved M-RoPE on the rotary dims (positions [3, T] when a step holds
        # images). Text only (no mrope_section): the three rows are equal, plain RoPE.
        self.rotary = RotaryEmbedding(
            config.rotary_dim, config.rope_theta, config.mrope_section,
            mrope_interleaved=config.mrope_interleaved,
        )  # fmt: skip
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
        states: StepStates | None = None,
    ) -> torch.Tensor:
        assert states is not None, "a hybrid model steps with its sequences' state slots"
        x = self.embed(input_ids) if input_embeds is None else input_embeds
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, backend, states)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return (hidden @ weight.T).float()


def build(config: TextModelConfig) -> Qwen3_5LM:
    return Qwen3_5LM(config)
