"""What a tensor-parallel size must satisfy, checked before any rank starts."""

from __future__ import annotations

import json
from pathlib import Path

from llm_svc.engine.models.config import TextModelConfig


def check_tensor_parallel(model_dir: Path, size: int, device: str) -> None:
    """Raise ValueError naming the value and the limit when `size` cannot serve the model
    on `device`: it must divide the attention heads and the MLP width, divide or be a
    multiple of the KV heads, divide a hybrid model's linear-attention key heads (and so
    its value heads, a multiple of them), not exceed the CUDA devices, and be 1 for a
    quantized checkpoint (its packed weights are not sliced)."""
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {size}")
    if size == 1:
        return
    model = TextModelConfig.from_model_dir(model_dir)
    for kind, shape in (model.kv_shapes or {}).items():
        # Gemma 4: each layer kind's KV heads, split or replicated as the other families'.
        if shape.num_kv_heads % size and size % shape.num_kv_heads:
            raise ValueError(
                f"tensor_parallel_size {size} neither divides nor is a multiple of the "
                f"model's {shape.num_kv_heads} KV heads on its {kind} layers"
            )
    if model.num_heads % size:
        raise ValueError(
            f"tensor_parallel_size {size} does not divide the model's {model.num_heads} "
            "attention heads"
        )
    kv = model.num_kv_heads
    if kv % size and size % kv:
        raise ValueError(
            f"tensor_parallel_size {size} neither divides nor is a multiple of the "
            f"model's {kv} KV heads"
        )
    if model.widest_mlp % size or model.intermediate_size % size:
        raise ValueError(
            f"tensor_parallel_size {size} does not divide the model's MLP width "
            f"{model.intermediate_size}"
        )
    moe = model.moe
    if moe is not None and moe.intermediate_size % size:
        raise ValueError(
            f"tensor_parallel_size {size} does not divide the model's expert width "
            f"{moe.intermediate_size}"
        )
    if moe is not None and moe.shared_expert_size % size:
        raise ValueError(
            f"tensor_parallel_size {size} does not divide the model's shared expert width "
            f"{moe.shared_expert_size}"
        )
    linear = model.linear
    if linear is not None and linear.num_key_heads % size:
        # Each rank keeps whole groups: its key heads and the value heads that read them.
        raise ValueError(
            f"tensor_parallel_size {size} does not divide the model's "
            f"{linear.num_key_heads} linear-attention key heads"
        )
    raw = json.loads((Path(model_dir) / "config.json").read_text())
    quantized = raw.get("quantization_config") or (raw.get("text_config") or {}).get(
        "quantization_config"
    )
    if quantized:
        method = quantized.get("quant_method", "?") if isinstance(quantized, dict) else "?"
        raise ValueError(
            f"tensor_parallel_size {size} with a quantized checkpoint ({method}) is not "
            "supported: serve it with tensor_parallel_size 1"
        )
    if device.startswith("cuda"):
        import torch

        count = torch.cuda.device_count()
        if size > count:
            raise ValueError(
                f"tensor_parallel_size {size} needs {size} CUDA devices; {count} visible"
            )
