"""Language models the engine runs: one module per decoder family (llama.py for Llama,
Mistral and Qwen2; qwen3.py, qwen3_moe.py, qwen2_moe.py, gemma3.py, qwen3_vl.py), built
from the blocks in layers.py and moe.py, chosen by registry.py."""

from __future__ import annotations

from pathlib import Path

import torch

from llm_svc.engine.models.config import TextModelConfig, UnsupportedModelError
from llm_svc.engine.models.decoder import DecoderLM, DeepstackRows
from llm_svc.engine.models.loader import find_text_prefix, load_weights, swap_quantized_layers
from llm_svc.engine.models.registry import build_decoder, supported_families


def load_model(
    model_dir: str | Path, dtype: torch.dtype, device: torch.device, group=None
) -> tuple[DecoderLM, TextModelConfig]:
    """Build the decoder for `model_dir` and load its weights, in eval mode; with `group`
    (a tensor-parallel RankGroup), only this rank's shard of them."""
    config = TextModelConfig.from_model_dir(model_dir)
    shards = None
    with torch.device("meta"):
        model = build_decoder(config)
        if group is not None:
            from llm_svc.engine.parallel.sharding import shard_decoder

            shards = shard_decoder(model, config, group)
    model = model.to_empty(device=device).to(dtype)
    # After the cast: FP8 layers keep their FP8 weights and float32 scales.
    swap_quantized_layers(model, model_dir, dtype)
    load_weights(model, model_dir, shards)
    return model.eval(), config


__all__ = [
    "DecoderLM",
    "DeepstackRows",
    "TextModelConfig",
    "UnsupportedModelError",
    "find_text_prefix",
    "load_model",
    "load_weights",
    "supported_families",
]
