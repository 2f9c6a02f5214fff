"""Checkpoints of a realistic size (>= 100 MB) for the loading-memory tests, written cheaply:
transformers builds the model on the meta device (names and shapes only) and the tensors
are random, made directly in the stored dtype."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# Five layers of 1024 x 2816 MLPs and a 4096-row vocabulary: 135 MB in bfloat16, and no
# single tensor above about 6 % of it (the loader holds one tensor in flight at a time).
SHAPE = dict(
    vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=5,
    num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=1024,
)  # fmt: skip


def big_llama(out: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """A random Llama of SHAPE saved in `dtype` under `out`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPE, tie_word_embeddings=False)
    config.architectures = ["LlamaForCausalLM"]
    with torch.device("meta"):
        names = {name: p.shape for name, p in LlamaForCausalLM(config).state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    tensors = {
        name: (torch.randn(shape, generator=generator) * 0.02).to(dtype)
        for name, shape in names.items()
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config.save_pretrained(out)
    return out


def fp8_copy(source: Path, out: Path) -> Path:
    """`source` with its decoder linears in FP8 (compressed-tensors, per-channel scales,
    weight-only); embeddings, norms and lm_head stay as stored."""
    config = json.loads((source / "config.json").read_text())
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
               "strategy": "channel"}  # fmt: skip
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                      "input_activations": None}},
        "ignore": ["lm_head"], "quantization_status": "compressed",
    }  # fmt: skip
    tensors = {}
    for name, tensor in load_file(source / "model.safetensors").items():
        if ".layers." in name and name.endswith("_proj.weight"):
            scale = tensor.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
            tensors[name] = (tensor.float() / scale).to(FP8)
            tensors[name[: -len("weight")] + "weight_scale"] = scale
        else:
            tensors[name] = tensor
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
