"""Turn a freshly built (meta) DecoderLM into this rank's shard, before its weights load.

Attention: q/k/v column-parallel by heads (KV heads split, or replicated when fewer than
ranks), o_proj row-parallel. MLP: gate/up column-parallel, down row-parallel. One
all-reduce after o_proj and one after down_proj per layer, one after the embedding.
"""

from __future__ import annotations

from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.models.decoder import DecoderLM
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
    inter = group.span(config.intermediate_size)
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        bias = config.attention_bias
        attn.q_proj = ColumnParallelLinear(hidden, [(q_start * d, q_stop * d)], bias)
        attn.k_proj = ColumnParallelLinear(hidden, [(kv_start * d, kv_stop * d)], bias)
        attn.v_proj = ColumnParallelLinear(hidden, [(kv_start * d, kv_stop * d)], bias)
        attn.o_proj = RowParallelLinear((q_start * d, q_stop * d), hidden, group)
        attn.num_heads, attn.num_kv_heads = q_stop - q_start, kv_stop - kv_start
        if not hasattr(mlp, "gate_proj"):
            continue  # Qwen3-VL-MoE's experts stay whole on every rank (their input is)
        mlp.gate_proj = ColumnParallelLinear(hidden, [inter], bias=False)
        mlp.up_proj = ColumnParallelLinear(hidden, [inter], bias=False)
        mlp.down_proj = RowParallelLinear(inter, hidden, group)
    model.embed_tokens = VocabParallelEmbedding(config.vocab_size, hidden, group)
    if model.lm_head is not None:
        model.lm_head = ParallelLMHead(config.vocab_size, hidden, group)
    # Norm weights are whole on every rank: they have no shard.
    params = model.named_parameters()
    return {name: param.shard for name, param in params if hasattr(param, "shard")}
