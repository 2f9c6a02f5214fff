"""FP8 checkpoints for the tests, made here from tiny random ones, in each layout Iris serves,
and the plain float32 checkpoint of the very weights they hold (the reference).

The arithmetic is written out here on purpose, not taken from iris.models.fp8: the engine's
dequantization is what the tests check.

Layouts (`quantize`): "tensor" and "channel" (compressed-tensors, dynamic per-token FP8
activations: the engine's W8A8 path), "static" (per-channel weights, a static per-tensor
`input_scale`), "weight-only" (compressed-tensors, per-channel, no activation scheme) and
"block" (`quant_method: fp8`, 128x128 `weight_scale_inv`). Each leaves `lm_head` and
`layers.1.mlp.down_proj` unquantized by config.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.llm_svc.checkpoints import CACHE_ROOT, TEXT, _tokenizer

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 128
STATIC_INPUT_SCALE = 0.05  # activations up to 22.4 are represented; larger ones clip
KEPT = "layers.1.mlp.down_proj"  # left unquantized by every layout's config
LAYOUTS = ("tensor", "channel", "static", "weight-only", "block")
W8A8_LAYOUTS = ("tensor", "channel", "static")
# Hidden 160 and intermediate 288 are not multiples of 128: partial blocks on both axes.
ODD_TEXT = dict(TEXT, hidden_size=160, intermediate_size=288, num_attention_heads=4)


def _atomic_build(name: str, build) -> Path:
    target = CACHE_ROOT / f"{name}-fp8v1"
    if (target / "config.json").is_file():
        return target
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=CACHE_ROOT, prefix=f".{name}-"))
    try:
        build(staging)
        os.replace(staging, target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def odd_llama() -> Path:
    """A tiny random Llama whose linear layers are 160 and 288 wide (not multiples of 128)."""

    def build(out: Path) -> None:
        import transformers as tf

        torch.manual_seed(1)
        tokenizer = _tokenizer()
        eos = tokenizer.convert_tokens_to_ids("<|end|>")
        config = tf.LlamaConfig(
            **ODD_TEXT, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=False,
        )  # fmt: skip
        model = tf.LlamaForCausalLM(config)
        model.generation_config.eos_token_id = eos
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)

    return _atomic_build("odd-llama", build)


def _quantizable(name: str, tensor: torch.Tensor) -> bool:
    # Every linear weight: 2-D, not an embedding table, not the output head, not KEPT.
    return (
        name.endswith(".weight")
        and tensor.dim() == 2
        and "embed" not in name
        and "lm_head" not in name
        and KEPT not in name
    )


def _scales(weight: torch.Tensor, layout: str) -> torch.Tensor:
    """The scale each FP8 value is multiplied by: [1], [out, 1] or the block grid."""
    w = weight.float().abs()
    if layout == "tensor":
        return (w.amax() / FP8_MAX).reshape(1)
    if layout == "block":
        rows, cols = (math.ceil(n / BLOCK) for n in w.shape)
        padded = torch.zeros(rows * BLOCK, cols * BLOCK)
        padded[: w.shape[0], : w.shape[1]] = w
        blocks = padded.reshape(rows, BLOCK, cols, BLOCK).amax(dim=(1, 3))
        return blocks.clamp(min=1e-12) / FP8_MAX
    return w.amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX


def full_scale(scale: torch.Tensor, shape, block: bool) -> torch.Tensor:
    """A scale broadcast to the weight's shape (a block grid repeated, then cut)."""
    if block:
        full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        return full[: shape[0], : shape[1]]
    return scale.reshape(-1, 1)


def _config(layout: str) -> dict:
    if layout == "block":
        return {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [BLOCK, BLOCK], "modules_to_not_convert": ["lm_head", KEPT],
        }  # fmt: skip
    weights = {
        "num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
        "strategy": "tensor" if layout == "tensor" else "channel",
    }  # fmt: skip
    inputs = None
    if layout in ("tensor", "channel"):
        inputs = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
    elif layout == "static":
        inputs = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
    return {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"], "weights": weights, "input_activations": inputs,
        }},
        "ignore": ["lm_head", "re:.*" + KEPT.replace(".", r"\.")],
        "quantization_status": "compressed",
    }  # fmt: skip


def quantize(source: Path, layout: str) -> Path:
    """`source`'s checkpoint with its linear layers in FP8, laid out as `layout`."""

    def build(out: Path) -> None:
        for item in source.iterdir():
            if item.suffix != ".safetensors" and item.is_file():
                shutil.copy(item, out / item.name)
        config = json.loads((source / "config.json").read_text())
        config["quantization_config"] = _config(layout)
        (out / "config.json").write_text(json.dumps(config, indent=2))
        for file in sorted(source.glob("*.safetensors")):
            tensors = {}
            for name, tensor in load_file(file).items():
                if not _quantizable(name, tensor):
                    tensors[name] = tensor
                    continue
                module = name[: -len(".weight")]
                scale = _scales(tensor, layout)
                full = full_scale(scale, tensor.shape, layout == "block")
                tensors[name] = (tensor.float() / full).clamp(-FP8_MAX, FP8_MAX).to(FP8)
                suffix = ".weight_scale_inv" if layout == "block" else ".weight_scale"
                tensors[module + suffix] = scale
                if layout == "static":
                    tensors[module + ".input_scale"] = torch.tensor([STATIC_INPUT_SCALE])
            save_file(tensors, out / file.name, metadata={"format": "pt"})

    return _atomic_build(f"{source.name}-{layout}", build)


def dequantized(quantized: Path) -> Path:
    """The plain float32 checkpoint of exactly the weights `quantized` holds."""

    def build(out: Path) -> None:
        for item in quantized.iterdir():
            if item.suffix != ".safetensors" and item.is_file():
                shutil.copy(item, out / item.name)
        config = json.loads((quantized / "config.json").read_text())
        config.pop("quantization_config")
        (out / "config.json").write_text(json.dumps(config, indent=2))
        for file in sorted(quantized.glob("*.safetensors")):
            stored = load_file(file)
            tensors = {}
            for name, tensor in stored.items():
                if name.endswith((".weight_scale", ".weight_scale_inv", ".input_scale")):
                    continue
                if tensor.dtype == FP8:
                    module = name[: -len(".weight")]
                    block = module + ".weight_scale_inv" in stored
                    scale = stored[module + (".weight_scale_inv" if block else ".weight_scale")]
                    tensor = tensor.float() * full_scale(scale, tensor.shape, block)
                tensors[name] = tensor.float()
            save_file(tensors, out / file.name, metadata={"format": "pt"})

    return _atomic_build(f"{quantized.name}-dequantized", build)
