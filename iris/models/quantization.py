"""A checkpoint's `quantization_config`, read without torch: the one check the gateway, the
encoder and the engine make before loading a model (docs/design/parallelism.md).

Iris serves FP8 weights in two layouts; every other method is refused by name:
- compressed-tensors `float-quantized`: `weight_scale` per tensor or per output channel,
  activations quantized per token (dynamic) or by a static per-tensor `input_scale`, or not
  at all (weight-only); layers named in `ignore` stay unquantized;
- `quant_method: fp8` with `weight_block_size`: `weight_scale_inv` on blocks (128x128 in
  practice; ceil-divided grids), weight-only; layers in `modules_to_not_convert` stay so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SUPPORTED = (
    "compressed-tensors (float-quantized FP8 weights, per-tensor or per-channel scales)",
    "fp8 (block-wise weight_scale_inv, weight_block_size)",
)


class UnsupportedQuantizationError(ValueError):
    """The checkpoint's quantization is not one Iris serves; the message names it."""


def _refuse(what: str) -> UnsupportedQuantizationError:
    return UnsupportedQuantizationError(
        f"quantization {what} is not supported; Iris serves unquantized checkpoints and "
        f"FP8: {'; '.join(SUPPORTED)}"
    )


@dataclass(frozen=True)
class QuantScheme:
    """How one checkpoint's FP8 linear layers are stored.

    `strategy`: "tensor" | "channel" | "block"; `block` is (rows, cols) for "block".
    `activations`: "dynamic" (per token, at run time), "static" (`input_scale`), or None
    (weight-only). `scale_name`: the tensor beside `weight` holding its scale.
    """

    method: str
    strategy: str
    activations: str | None
    block: tuple[int, int] | None
    scale_name: str
    ignore: tuple[str, ...]

    def ignores(self, module: str) -> bool:
        """True if the config leaves `module` (its checkpoint name, without `.weight`)
        unquantized: compressed-tensors' `ignore` holds exact names or `re:` patterns,
        the fp8 layout's `modules_to_not_convert` name parts of module names."""
        for entry in self.ignore:
            if self.method == "compressed-tensors":
                if entry.startswith("re:"):
                    if re.match(entry[3:], module):
                        return True
                elif module == entry or module.endswith("." + entry):
                    return True
            elif entry in module:
                return True
        return False


def read_quantization(config: dict) -> QuantScheme | None:
    """The scheme of a model's config.json (None: not quantized); UnsupportedQuantizationError
    naming the method, and the ones Iris serves, for anything else."""
    raw = config.get("quantization_config")
    if raw is None:
        text = config.get("text_config") or {}
        raw = text.get("quantization_config")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _refuse(f"config {raw!r}")
    method = raw.get("quant_method")
    if method == "compressed-tensors":
        return _compressed_tensors(raw)
    if method == "fp8":
        return _block_fp8(raw)
    if method is None and (raw.get("load_in_4bit") or raw.get("load_in_8bit")):
        method = "bitsandbytes"
    raise _refuse(f"method {method!r}")


def check_quantization(config: dict) -> None:
    """Raise UnsupportedQuantizationError unless the config is unquantized or FP8 in a
    layout Iris serves."""
    read_quantization(config)


def _is_fp8(args: dict | None) -> bool:
    return bool(args) and args.get("type") == "float" and args.get("num_bits") == 8


def _compressed_tensors(raw: dict) -> QuantScheme:
    groups = list((raw.get("config_groups") or {}).values())
    if not groups:
        raise _refuse("method 'compressed-tensors' with no config_groups")
    first = groups[0]
    # The format is top-level, or per group (then the top level may say "mixed-precision").
    formats = {group.get("format") or raw.get("format") for group in groups}
    if not formats <= {"float-quantized", "naive-quantized"}:
        fmt = sorted(map(str, formats - {"float-quantized", "naive-quantized"}))[0]
        raise _refuse(f"method 'compressed-tensors' with format {fmt!r}")
    if any(
        group.get("weights") != first.get("weights")
        or group.get("input_activations") != first.get("input_activations")
        for group in groups
    ):
        raise _refuse("method 'compressed-tensors' with differing config_groups")
    weights, inputs = first.get("weights"), first.get("input_activations")
    if not _is_fp8(weights):
        raise _refuse(f"method 'compressed-tensors' with weights {weights!r}")
    strategy = weights.get("strategy")
    if strategy not in ("tensor", "channel"):
        raise _refuse(f"method 'compressed-tensors' with weight strategy {strategy!r}")
    if inputs is None:
        activations = None
    elif not _is_fp8(inputs):
        raise _refuse(f"method 'compressed-tensors' with input_activations {inputs!r}")
    elif inputs.get("dynamic"):
        activations = "dynamic"
    elif inputs.get("strategy", "tensor") == "tensor":
        activations = "static"
    else:
        raise _refuse(f"method 'compressed-tensors' with static {inputs.get('strategy')!r} inputs")
    if first.get("output_activations"):
        raise _refuse("method 'compressed-tensors' with output_activations")
    return QuantScheme(
        method="compressed-tensors",
        strategy=strategy,
        activations=activations,
        block=None,
        scale_name="weight_scale",
        ignore=tuple(raw.get("ignore") or ()),
    )


def _block_fp8(raw: dict) -> QuantScheme:
    block = raw.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(b > 0 for b in block)):
        raise _refuse(f"method 'fp8' with weight_block_size {block!r} (want [rows, cols])")
    if raw.get("fmt", "e4m3") != "e4m3":
        raise _refuse(f"method 'fp8' with fmt {raw.get('fmt')!r}")
    return QuantScheme(
        method="fp8",
        strategy="block",
        activations=None,  # a block-wise FP8 matmul is not in Iris: weight-only
        block=(int(block[0]), int(block[1])),
        scale_name="weight_scale_inv",
        ignore=tuple(raw.get("modules_to_not_convert") or ()),
    )
