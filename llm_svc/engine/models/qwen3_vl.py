"""Qwen3-VL's language model, dense and MoE: Qwen3 layers (`qwen3_layer`: per-head RMSNorm
on q and k before RoPE, no q/k/v bias), the experts of Qwen3-MoE on the sparse layers of
Qwen3-VL-MoE (`moe_or_dense`), interleaved M-RoPE (`config.mrope_interleaved`, read by
the shared RotaryEmbedding), and deepstack: after decoder layer i (i < levels) the step's
image rows get level i added (`DecoderLM.forward`'s `deepstack`, a `DeepstackRows`)."""

from __future__ import annotations

from llm_svc.engine.models.config import TextModelConfig
from llm_svc.engine.models.decoder import DecoderLM
from llm_svc.engine.models.qwen3 import qwen3_layer
from llm_svc.engine.models.qwen3_moe import moe_or_dense


def build(config: TextModelConfig) -> DecoderLM:
    """Qwen3-VL (config.moe None: every MLP dense) or Qwen3-VL-MoE (experts where sparse)."""
    layers = [qwen3_layer(config, i, moe_or_dense(config, i)) for i in range(config.num_layers)]
    return DecoderLM(config, layers)
