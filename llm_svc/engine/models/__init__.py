"""Language models the engine runs: one compact decoder for the Llama and Qwen2 families
(Qwen2 differs by q/k/v biases and, for Qwen2-VL, M-RoPE — both read from the config)."""

from __future__ import annotations

from pathlib import Path

import torch

from llm_svc.engine.models.config import TextModelConfig, UnsupportedModelError
from llm_svc.engine.models.decoder import DecoderLM
from llm_svc.engine.models.layers import RotaryEmbedding
from llm_svc.engine.models.loader import (
    building_in,
    find_text_prefix,
    load_weights,
    materialize,
    swap_quantized_layers,
)


def load_model(
    model_dir: str | Path, dtype: torch.dtype, device: torch.device, group=None
) -> tuple[DecoderLM, TextModelConfig]:
    """Build the decoder for `model_dir` and load its weights, in eval mode; with `group`
    (a tensor-parallel RankGroup), only this rank's shard of them.

    Every layer is built in its final dtype and layout (this rank's shard, FP8 layers as
    FP8) before anything is allocated, so loading needs the weights' own bytes and no more
    (docs/design.md §3 "Loading")."""
    config = TextModelConfig.from_model_dir(model_dir)
    shards = None
    with building_in(dtype):
        model = DecoderLM(config)
        if group is not None:
            from llm_svc.engine.parallel.sharding import shard_decoder

            shards = shard_decoder(model, config, group)
        swap_quantized_layers(model, model_dir, dtype, device)
    model = materialize(model, device)
    # RoPE frequencies are computed, not loaded, and stay fp32 whatever the weights' dtype.
    model.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.mrope_section)
    model.rotary.to(device)
    load_weights(model, model_dir, shards)
    return model.eval(), config


__all__ = [
    "DecoderLM",
    "TextModelConfig",
    "UnsupportedModelError",
    "find_text_prefix",
    "load_model",
    "load_weights",
]
