"""Turn a freshly built (meta) DecoderLM into this rank's shard, before its weights load.

Attention: q/k/v column-parallel by heads (KV heads split, or replicated when fewer than
ranks), o_proj row-parallel; per-head q/k norms are whole on every rank. Dense MLP:
gate/up column-parallel, down row-parallel. Mixture of experts (moe.py): every expert's
intermediate dimension is split like a dense MLP's, the router is whole on every rank, and
the shared expert (Qwen2-MoE) is split the same way; the block's partial sum is
all-reduced once. So: one all-reduce after o_proj and one after the MLP per layer, one
after the embedding.
"""

from __future__ import annotations

import torch
from torch import nn

from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.models.decoder import DecoderLM
from llm_svc.engine.models.layers import GatedMLP
from llm_svc.engine.models.moe import SparseMoE
from llm_svc.engine.parallel.group import RankGroup
from llm_svc.engine.parallel.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
)


def shard_decoder(model: DecoderLM, config: TextModelConfig, group: RankGroup) -> dict:
    """Replace `model`'s layers by this rank's shards, in place (names are kept); returns
    {parameter name: the function cutting its shard from the checkpoint's tensor}."""
    hidden, d = config.hidden_size, config.head_dim
    q_start, q_stop = group.span(config.num_heads)
    kv_start, kv_stop = group.kv_heads(config.num_kv_heads)
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        bias = config.attention_bias
        attn.q_proj = ColumnParallelLinear(hidden, [(q_start * d, q_stop * d)], bias)
        attn.k_proj = ColumnParallelLinear(hidden, [(kv_start * d, kv_stop * d)], bias)
        attn.v_proj = ColumnParallelLinear(hidden, [(kv_start * d, kv_stop * d)], bias)
        attn.o_proj = RowParallelLinear((q_start * d, q_stop * d), hidden, group)
        attn.num_heads, attn.num_kv_heads = q_stop - q_start, kv_stop - kv_start
        if isinstance(mlp, SparseMoE):
            _shard_moe(mlp, hidden, group)
        else:
            _shard_mlp(mlp, hidden, group, reduce=True)
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


def _shard_moe(moe: SparseMoE, hidden: int, group: RankGroup) -> None:
    experts = moe.experts
    start, stop = group.span(experts.intermediate)
    width, total = stop - start, experts.intermediate
    gate_up = nn.Parameter(torch.empty(experts.num_experts, 2 * width, hidden))
    # Rows [start, stop) of the gate half and of the up half of every expert.
    gate_up.shard = lambda full: torch.cat(
        [full[:, start:stop], full[:, total + start : total + stop]], dim=1
    )
    down = nn.Parameter(torch.empty(experts.num_experts, hidden, width))
    down.shard = lambda full: full[:, :, start:stop]
    experts.gate_up_proj, experts.down_proj, experts.intermediate = gate_up, down, width
    if moe.shared_expert is not None:
        _shard_mlp(moe.shared_expert, hidden, group, reduce=False)
    moe.group = group  # routed + shared partial sums: one all-reduce
