"""Language models the engine runs: one module per decoder family (llama.py for Llama,
Mistral and Qwen2; qwen3.py, qwen3_moe.py, qwen2_moe.py, gemma3.py, gemma4.py,
qwen3_vl.py; qwen3_5.py, the hybrid Qwen3.5 with Gated DeltaNet linear attention), built
from the blocks in layers.py and moe.py, chosen by registry.py."""

from __future__ import annotations

from pathlib import Path

import torch

from llm_svc.engine.models.config import TextModelConfig, UnsupportedModelError
from llm_svc.engine.models.cpu_layout import lay_out_for_cpu
from llm_svc.engine.models.decoder import DecoderLM, DeepstackRows
from llm_svc.engine.models.loader import (
    building_in,
    find_text_prefix,
    load_weights,
    materialize,
    swap_quantized_layers,
)
from llm_svc.engine.models.registry import build_decoder, supported_families


def load_model(
    model_dir: str | Path, dtype: torch.dtype, device: torch.device, group=None
) -> tuple[DecoderLM, TextModelConfig]:
    """Build the decoder for `model_dir` and load its weights, in eval mode; with `group`
    (a tensor-parallel RankGroup), only this rank's shard of them.

    Every layer is built in its final dtype and layout (this rank's shard, FP8 layers as
    FP8) before anything is allocated, so loading needs the weights' own bytes and no more
    (docs/design/engine.md, "Loading")."""
    config = TextModelConfig.from_model_dir(model_dir)
    shards = None
    if config.is_hybrid and config.quantization is not None:
        raise UnsupportedModelError(
            f"{config.architecture}: FP8 is not supported for hybrid (linear-attention) models yet"
        )
    with building_in(dtype):
        model = build_decoder(config)
        if group is not None:
            from llm_svc.engine.parallel.sharding import shard_decoder

            shards = shard_decoder(model, config, group)
        swap_quantized_layers(model, model_dir, dtype, device)
        if device.type == "cpu" and dtype == torch.float32:
            lay_out_for_cpu(model)  # MKL's fast operand layout (cpu_layout.py)
    # RoPE tables are computed on first use, in float32 (layers.RotaryEmbedding): nothing
    # computed needs rebuilding after the allocation.
    model = materialize(model, device)
    load_weights(model, model_dir, shards)
    return model.eval(), config


__all__ = [
    "DecoderLM",
    "DeepstackRows",
    "Qwen3_5LM",
    "TextModelConfig",
    "UnsupportedModelError",
    "find_text_prefix",
    "load_model",
    "load_weights",
    "supported_families",
]
