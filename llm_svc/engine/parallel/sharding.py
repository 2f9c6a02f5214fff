"""Turn a freshly built (meta) DecoderLM into this rank's shard, before its weights load.

Attention: q/k/v column-parallel by heads (KV heads split, or replicated when fewer than
ranks), o_proj row-parallel; per-head q/k norms are whole on every rank. Qwen3.5's hybrid
layers: its gated attention the same way (each head's query and gate rows together), its
Gated DeltaNet layers by key-head groups (`_shard_gated_deltanet`), with out_proj
row-parallel; each rank keeps its heads' linear-attention states (a pool of its own). Dense MLP:
gate/up column-parallel, down row-parallel. Mixture of experts (moe.py): every expert's
intermediate dimension is split like a dense MLP's, the router is whole on every rank, and
the shared expert (Qwen2-MoE) is split the same way; the block's partial sum is
all-reduced once. So: one all-reduce after o_proj and one after the MLP per layer, one
after the embedding. Gemma 4 (`_shard_gemma4`): each layer kind's heads at its own shape
(a kind with fewer KV heads than ranks, as a full layer's one global KV head, replicated);
its dense MLP and its experts each all-reduced on their own, as each has its own post-norm;
per-layer embeddings and the router whole on every rank.
"""

from __future__ import annotations

import torch
from torch import nn

from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.models.decoder import DecoderLM
from llm_svc.engine.models.expert_weights import expert_shard
from llm_svc.engine.models.layers import GatedMLP
from llm_svc.engine.models.moe import SparseMoE
from llm_svc.engine.models.shard import Shard
from llm_svc.engine.parallel.group import RankGroup
from llm_svc.engine.parallel.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
)


def shard_decoder(model: DecoderLM, config: TextModelConfig, group: RankGroup) -> dict:
    """Replace `model`'s layers by this rank's shards, in place (names are kept); returns
    {parameter name: its Shard of the checkpoint's tensor} (models/shard.py)."""
    if config.family == "gemma4":
        return _shard_gemma4(model, config, group)
    hidden, d = config.hidden_size, config.head_dim
    q_start, q_stop = group.span(config.num_heads)
    kv_start, kv_stop = group.kv_heads(config.num_kv_heads)
    for layer in model.layers:
        mlp = layer.mlp
        if isinstance(mlp, SparseMoE):
            _shard_moe(mlp, hidden, group)
        else:
            _shard_mlp(mlp, hidden, group, reduce=True)
        if config.is_hybrid and layer.linear:
            _shard_gated_deltanet(layer.linear_attn, config, group)
            continue
        attn = layer.self_attn
        # Qwen3.5's gated attention packs [query | gate] per head: 2 * d rows a head.
        per_head = 2 * d if config.is_hybrid else d
        bias = config.attention_bias
        q_rows = [(q_start * per_head, q_stop * per_head)]
        attn.q_proj = ColumnParallelLinear(hidden, q_rows, bias)
        attn.k_proj = ColumnParallelLinear(hidden, [(kv_start * d, kv_stop * d)], bias)
        attn.v_proj = ColumnParallelLinear(hidden, [(kv_start * d, kv_stop * d)], bias)
        attn.o_proj = RowParallelLinear((q_start * d, q_stop * d), hidden, group)
        attn.num_heads, attn.num_kv_heads = q_stop - q_start, kv_stop - kv_start
    model.embed_tokens = VocabParallelEmbedding(config.vocab_size, hidden, group)
    if model.lm_head is not None:
        model.lm_head = ParallelLMHead(config.vocab_size, hidden, group)
    # Norm weights are whole on every rank: they have no shard.
    params = model.named_parameters()
    return {name: param.shard for name, param in params if hasattr(param, "shard")}


def _shard_mlp(mlp: GatedMLP, hidden: int, group: RankGroup, reduce: bool) -> None:
    inter = group.span(mlp.gate_proj.out_features)
    mlp.gate_proj = ColumnParallelLinear(hidden, [inter], bias=False)
    mlp.up_proj = ColumnParallelLinear(hidden, [inter], bias=False)
    mlp.down_proj = RowParallelLinear(inter, hidden, group, reduce=reduce)


def _shard_gemma4(model: DecoderLM, config: TextModelConfig, group: RankGroup) -> dict:
    """Gemma 4 (models/gemma4.py) as shard_decoder does the others, but per layer kind's KV
    shape; a layer reading another's KV has only q_proj and o_proj, and a full layer with
    keys equal values no v_proj."""
    hidden = config.hidden_size
    q_start, q_stop = group.span(config.num_heads)
    for index, layer in enumerate(model.layers):
        # The dense MLP's output meets post_feedforward_layernorm_1 first (with the MoE
        # block) or post_feedforward_layernorm: whole on every rank, so reduced at once.
        _shard_mlp(layer.mlp, hidden, group, reduce=True)
        if layer.moe:
            _shard_experts(layer.experts, hidden, group)
            layer.group = group
        attn, shape = layer.self_attn, config.kv_shape(config.layer_type(index))
        d = shape.head_dim
        bias = config.attention_bias
        attn.q_proj = ColumnParallelLinear(hidden, [(q_start * d, q_stop * d)], bias)
        attn.o_proj = RowParallelLinear((q_start * d, q_stop * d), hidden, group)
        attn.num_heads = q_stop - q_start
        kv_start, kv_stop = group.kv_heads(shape.num_kv_heads)
        attn.num_kv_heads = kv_stop - kv_start
        if attn.reads_shared:
            continue
        kv_rows = [(kv_start * d, kv_stop * d)]
        attn.k_proj = ColumnParallelLinear(hidden, kv_rows, bias)
        if attn.v_proj is not None:
            attn.v_proj = ColumnParallelLinear(hidden, kv_rows, bias)
    model.embed_tokens = VocabParallelEmbedding(config.vocab_size, hidden, group)
    if model.lm_head is not None:
        model.lm_head = ParallelLMHead(config.vocab_size, hidden, group)
    params = model.named_parameters()
    return {name: param.shard for name, param in params if hasattr(param, "shard")}


def _shard_moe(moe: SparseMoE, hidden: int, group: RankGroup) -> None:
    _shard_experts(moe.experts, hidden, group)
    if moe.shared_expert is not None:
        _shard_mlp(moe.shared_expert, hidden, group, reduce=False)
    moe.group = group  # routed + shared partial sums: one all-reduce


def _shard_experts(experts, hidden: int, group: RankGroup) -> None:
    """Every expert's intermediate dimension split as a dense MLP's (no reduce here)."""
    span, total = group.span(experts.intermediate), experts.intermediate
    width = span[1] - span[0]
    gate_up = nn.Parameter(torch.empty(experts.num_experts, 2 * width, hidden))
    gate_up.shard = expert_shard("gate_up_proj", span, total)
    down = nn.Parameter(torch.empty(experts.num_experts, hidden, width))
    down.shard = expert_shard("down_proj", span, total)
    experts.gate_up_proj, experts.down_proj, experts.intermediate = gate_up, down, width


def _shard_gated_deltanet(attn, config: TextModelConfig, group: RankGroup) -> None:
    """Qwen3.5's linear attention (models/qwen3_5.py GatedDeltaNet) by head groups: this
    rank's key heads [ks, ke) and the value heads that read them, [vs, ve) (value head j
    reads key head j // (Hv / Hk), so contiguous spans keep every group whole). The packed
    in_proj_qkv (and the depthwise conv over its channels) is [q | k | v], each head after
    head: rows of the rank's heads in each of the three blocks. z, b, a, dt_bias and A_log
    are per value head; out_proj is row-parallel over the value heads' features; the
    gated norm (per head, dv wide) is whole on every rank."""
    shape, hidden = config.linear, config.hidden_size
    dk, dv = shape.key_head_dim, shape.value_head_dim
    ks, ke = group.span(shape.num_key_heads)
    vs, ve = group.span(shape.num_value_heads)
    keys = shape.num_key_heads * dk
    channels = [(ks * dk, ke * dk), (keys + ks * dk, keys + ke * dk)]
    channels.append((2 * keys + vs * dv, 2 * keys + ve * dv))
    attn.in_proj_qkv = ColumnParallelLinear(hidden, channels, bias=False)
    attn.in_proj_z = ColumnParallelLinear(hidden, [(vs * dv, ve * dv)], bias=False)
    attn.in_proj_b = ColumnParallelLinear(hidden, [(vs, ve)], bias=False)
    attn.in_proj_a = ColumnParallelLinear(hidden, [(vs, ve)], bias=False)
    width = sum(stop - start for start, stop in channels)
    conv = nn.Conv1d(width, width, shape.conv_kernel, groups=width, bias=False)
    conv.weight.shard = Shard.of(*channels)
    attn.conv1d = conv
    for name in ("dt_bias", "A_log"):
        param = nn.Parameter(torch.empty(ve - vs))
        param.shard = Shard.of((vs, ve))
        setattr(attn, name, param)
    attn.out_proj = RowParallelLinear((vs * dv, ve * dv), hidden, group)
    attn.hk, attn.hv = ke - ks, ve - vs
