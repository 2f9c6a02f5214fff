"""FP8 linear layers for the decoder, and the swap of nn.Linear for them before loading.

Weights stay FP8 in memory. Which matmul runs is decided per layer at load:
- W8A8 (`Fp8ScaledLinear`): per-tensor or per-channel weight scales, a checkpoint that
  quantizes activations, and a device where `torch._scaled_mm` runs (probed once; the CPU
  does, CUDA from sm_89). Activations are quantized per token (or by the static
  `input_scale`) and the matmul runs on FP8 operands with the two scales.
- weight-only (`Fp8Linear`): everything else, block-wise scales always. The weight is
  dequantized to the compute dtype inside each call; only the FP8 copy is kept.

Experts stored in FP8 (block-wise) become `Fp8Experts`: FP8 stacked weights, each expert
dequantized at its use.

Both linear layers keep nn.Linear's interface (`in_features`, `out_features`, `weight`, `bias`,
forward(x [..., in]) -> [..., out]), so code that swaps linear layers (tensor parallelism)
sees the same shape of module.
"""

from __future__ import annotations

import functools
import logging
import re

import torch
import torch.nn.functional as F
from torch import nn

from iris.models.fp8 import FP8, FP8_MAX, block_grid, dequantize, expand_scale
from iris.models.quantization import QuantScheme
from llm_svc.engine.models.config import UnsupportedModelError
from llm_svc.engine.models.moe import Experts

log = logging.getLogger(__name__)
_TINY = 1e-12  # an all-zero activation row still gets a finite scale


class Fp8Linear(nn.Module):
    """Weight-only FP8 linear: `weight` float8_e4m3fn [out, in] and its scale
    (`weight_scale` [1] / [out, 1], or `weight_scale_inv` on the block grid)."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, scheme: QuantScheme, device
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, dtype=FP8, device=device), requires_grad=False
        )
        if scheme.strategy == "block":
            scale_shape = block_grid((out_features, in_features), scheme.block)
        elif scheme.strategy == "channel":
            scale_shape = (out_features, 1)
        else:
            scale_shape = (1,)
        scale = torch.empty(scale_shape, dtype=torch.float32, device=device)
        scale = nn.Parameter(scale, requires_grad=False)
        self.register_parameter(scheme.scale_name, scale)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, device=device), requires_grad=False)

    @property
    def scale(self) -> torch.Tensor:
        return getattr(self, self.scheme.scale_name)

    def dense_weight(self) -> torch.Tensor:
        """The weight in float32, as the checkpoint means it."""
        return dequantize(self.weight, self.scale, self.scheme)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dense_weight().to(x.dtype), bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, fp8 {self.scheme.strategy}"


class Fp8ScaledLinear(Fp8Linear):
    """W8A8 FP8 linear on `torch._scaled_mm`: activations quantized per token (dynamic) or
    by the checkpoint's `input_scale` (static), weights by their per-tensor or per-channel
    scale; the product is rescaled by both in the matmul's epilogue."""

    def __init__(self, in_features, out_features, bias, scheme: QuantScheme, device) -> None:
        super().__init__(in_features, out_features, bias, scheme, device)
        self.input_scale = None
        if scheme.activations == "static":
            scale = torch.empty(1, dtype=torch.float32, device=device)
            self.input_scale = nn.Parameter(scale, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features)
        xq, scale_a = quantize_activations(rows, self.input_scale)
        # _scaled_mm wants row-wise scales as [M, 1] and [1, N] (float32, contiguous).
        scale_b = expand_scale(self.scale, (self.out_features, 1), self.scheme)
        scale_b = scale_b.expand(self.out_features, 1).reshape(1, -1).contiguous()
        out = torch._scaled_mm(
            xq, self.weight.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=x.dtype
        )
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", W8A8 ({self.scheme.activations} activations)"


def quantize_activations(x: torch.Tensor, input_scale: torch.Tensor | None):
    """x [M, K] → (FP8 x, float32 scale [M, 1]): per row (token) from its absolute maximum,
    or the static per-tensor `input_scale` for every row."""
    x32 = x.float()
    if input_scale is None:
        scale = x32.abs().amax(dim=-1, keepdim=True).clamp(min=_TINY) / FP8_MAX
    else:
        scale = input_scale.float().reshape(1, 1).expand(x.shape[0], 1).contiguous()
    return (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


@functools.cache
def scaled_mm_runs(device: str, dtype: torch.dtype) -> bool:
    """Whether `torch._scaled_mm` with row-wise scales and `dtype` output runs on `device`
    (the CPU build does; CUDA needs sm_89+). Probed with a 16x16 product, once."""
    try:
        a = torch.zeros(16, 16, dtype=FP8, device=device)
        ones = torch.ones(16, 1, device=device)
        torch._scaled_mm(a, a.t(), scale_a=ones, scale_b=ones.reshape(1, 16), out_dtype=dtype)
    except (RuntimeError, NotImplementedError, TypeError) as error:
        log.info("torch._scaled_mm does not run on %s (%s): FP8 weight-only", device, error)
        return False
    return True


def _uses_scaled_mm(scheme: QuantScheme, linear: nn.Linear, device, dtype) -> bool:
    if scheme.strategy == "block" or scheme.activations is None:
        return False
    device = torch.device(device)
    if device.type == "cuda" and (linear.in_features % 16 or linear.out_features % 16):
        return False  # cuBLASLt's FP8 GEMM needs both dimensions multiples of 16
    return scaled_mm_runs(str(device), dtype)


def swap_fp8_linears(
    model: nn.Module, scheme: QuantScheme, quantized: set[str], device, dtype: torch.dtype
) -> dict[str, int]:
    """Replace each nn.Linear of `model` whose name is in `quantized` by an FP8 layer, built
    on the linear's own device (meta before loading); `device` is where it will run, which
    decides W8A8 or weight-only. Returns how many of each kind ({"W8A8": n,
    "weight-only": m})."""
    counts = {"W8A8": 0, "weight-only": 0}
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name in quantized
    ]
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        scaled = _uses_scaled_mm(scheme, linear, device, dtype)
        cls = Fp8ScaledLinear if scaled else Fp8Linear
        layer = cls(
            linear.in_features,
            linear.out_features,
            linear.bias is not None,
            scheme,
            linear.weight.device,
        )
        setattr(parent, child, layer)
        counts["W8A8" if scaled else "weight-only"] += 1
    return counts


class Fp8Experts(Experts):
    """Block-wise FP8 experts: `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I] in
    float8_e4m3fn, with `gate_up_proj_scale_inv` [E, 2·⌈I/b0⌉, ⌈H/b1⌉] (gate's block grid,
    then up's: each was quantized on its own [I, H] grid) and `down_proj_scale_inv`
    [E, ⌈H/b0⌉, ⌈I/b1⌉]. An expert's weights are dequantized, block by block, when it
    runs (the grouped path on every device: the fused kernel reads no FP8 yet)."""

    def __init__(self, experts: Experts, scheme: QuantScheme, hidden: int, device) -> None:
        nn.Module.__init__(self)
        num, inter = experts.num_experts, experts.intermediate
        self.num_experts, self.intermediate, self.act = num, inter, experts.act
        self.scheme, self.fused = scheme, False
        gate_grid = block_grid((inter, hidden), scheme.block)
        down_grid = block_grid((hidden, inter), scheme.block)

        def frozen(*shape, dtype=torch.float32):
            tensor = torch.empty(*shape, dtype=dtype, device=device)
            return nn.Parameter(tensor, requires_grad=False)

        self.gate_up_proj = frozen(num, 2 * inter, hidden, dtype=FP8)
        self.down_proj = frozen(num, hidden, inter, dtype=FP8)
        self.gate_up_proj_scale_inv = frozen(num, 2 * gate_grid[0], gate_grid[1])
        self.down_proj_scale_inv = frozen(num, *down_grid)

    def expert_weights(self, expert: int, dtype: torch.dtype):
        inter, grid_rows = self.intermediate, self.gate_up_proj_scale_inv.shape[1] // 2
        weight, scale = self.gate_up_proj[expert], self.gate_up_proj_scale_inv[expert]
        gate = dequantize(weight[:inter], scale[:grid_rows], self.scheme)
        up = dequantize(weight[inter:], scale[grid_rows:], self.scheme)
        down = dequantize(self.down_proj[expert], self.down_proj_scale_inv[expert], self.scheme)
        return torch.cat([gate, up]).to(dtype), down.to(dtype)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, intermediate={self.intermediate}, fp8 block"


_EXPERT = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)$")


def swap_fp8_experts(model: nn.Module, scheme: QuantScheme, quantized: set[str]) -> int:
    """Replace each Experts block whose experts the checkpoint stores in FP8 (per expert,
    `experts.{e}.{gate,up,down}_proj` with scales, in `quantized`) by `Fp8Experts`, built
    on the block's own device (meta before loading). Returns how many were swapped.
    UnsupportedModelError names what is not served: FP8 experts with per-tensor or
    per-channel scales, or a block with only some of its expert projections in FP8."""
    found: dict[str, set[tuple[int, str]]] = {}
    for name in quantized:
        match = _EXPERT.match(name)
        if match:
            found.setdefault(match[1], set()).add((int(match[2]), match[3]))
    for parent, projections in sorted(found.items()):
        experts = model.get_submodule(parent)
        if scheme.strategy != "block":
            raise UnsupportedModelError(
                f"FP8 experts with {scheme.method} {scheme.strategy} scales ({parent}) are "
                "not supported; FP8 experts are served with block-wise weight_scale_inv"
            )
        want = {(e, p) for e in range(experts.num_experts) for p in _PROJECTIONS}
        if projections != want:
            e, p = sorted(want - projections)[0]
            raise UnsupportedModelError(
                f"{parent}: some experts are FP8 and {parent}.{e}.{p} is not; a block's "
                "experts are served all FP8 or none"
            )
        device = experts.gate_up_proj.device
        swapped = Fp8Experts(experts, scheme, experts.gate_up_proj.shape[2], device)
        module_parent, _, child = parent.rpartition(".")
        setattr(model.get_submodule(module_parent), child, swapped)
    return len(found)


_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
