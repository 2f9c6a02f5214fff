"""FP8 weights to dense ones (torch): the arithmetic every loader shares, so the engine's
weight-only layers, the vision towers and the tests' reference checkpoints agree bit for bit.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from iris.models.checkpoint import load_tensors
from iris.models.quantization import QuantScheme

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
SCALE_NAMES = ("weight_scale", "weight_scale_inv", "input_scale")


def block_grid(shape: tuple[int, int], block: tuple[int, int]) -> tuple[int, int]:
    """The scale grid of a [rows, cols] weight on `block` tiles (ceil-divided)."""
    return math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])


def expand_scale(scale: torch.Tensor, shape: tuple[int, int], scheme: QuantScheme):
    """The scale as a tensor broadcastable to the weight's [out, in] `shape` (float32)."""
    scale = scale.float()
    if scheme.strategy == "block":
        rows, cols = scheme.block
        if tuple(scale.shape) != block_grid(shape, scheme.block):
            raise ValueError(
                f"weight_scale_inv shape {tuple(scale.shape)} does not tile weight "
                f"{tuple(shape)} in {rows}x{cols} blocks (want {block_grid(shape, scheme.block)})"
            )
        full = scale.repeat_interleave(rows, 0).repeat_interleave(cols, 1)
        return full[: shape[0], : shape[1]]
    if scheme.strategy == "channel":
        if scale.numel() != shape[0]:
            raise ValueError(
                f"per-channel weight_scale has {scale.numel()} values for {shape[0]} rows"
            )
        return scale.reshape(shape[0], 1)
    if scale.numel() != 1:
        raise ValueError(f"per-tensor weight_scale has {scale.numel()} values")
    return scale.reshape(1, 1)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """FP8 `weight` [out, in] times its scale, in float32."""
    if weight.dtype != FP8:
        raise ValueError(f"expected a float8_e4m3fn weight, got {weight.dtype}")
    return weight.float() * expand_scale(scale, tuple(weight.shape), scheme)


def quantized_modules(names, scheme: QuantScheme, prefix: str = "") -> list[str]:
    """Module names (no `.weight`) whose weight the checkpoint stores in FP8, i.e. that have
    the scheme's scale tensor beside it; an `ignore`d one is an error (config and weights
    disagree). `prefix`: what was stripped from `names` (ignore lists name full modules)."""
    suffix = "." + scheme.scale_name
    found = sorted(name[: -len(suffix)] for name in names if name.endswith(suffix))
    ignored = [name for name in found if scheme.ignores(prefix + name)]
    if ignored:
        raise ValueError(
            f"{len(ignored)} layers the quantization_config leaves unquantized have FP8 "
            f"scales in the checkpoint, e.g. {ignored[:3]}"
        )
    return found


def load_dense(model_dir: Path, prefix: str, scheme: QuantScheme | None) -> dict:
    """The tensors under `prefix` (keyed without it), every FP8 `X.weight` replaced by its
    float32 value and the scale tensors dropped: how a vision tower loads from an FP8
    checkpoint (its layers are dequantized once, at load)."""
    tensors = load_tensors(model_dir, prefix)
    if scheme is None:
        return tensors
    out = dict(tensors)
    for module in quantized_modules(list(tensors), scheme, prefix):
        weight = out.pop(module + ".weight")
        scale = out.pop(module + "." + scheme.scale_name)
        out[module + ".weight"] = dequantize(weight, scale, scheme)
        out.pop(module + ".input_scale", None)
    return out
