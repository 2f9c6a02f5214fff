"""Reading stacked expert weights from the layouts checkpoints use.

The engine holds `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I]
(llm_svc/engine/models/moe.py), HF's internal layout. Checkpoints store them
- per expert, `experts.{e}.gate_proj.weight` [I, H], `.up_proj.weight` [I, H],
  `.down_proj.weight` [H, I] (Qwen2-MoE and Qwen3-MoE, as `save_pretrained` writes them);
- stacked and transposed, `experts.gate_up_proj` [E, H, 2I] and `experts.down_proj`
  [E, I, H] (the published Qwen3-VL-MoE checkpoints); or
- stacked in the internal layout, [E, 2I, H] and [E, H, I] (what transformers 5.24's
  `save_pretrained` writes for Qwen3-VL-MoE).

A stacked tensor is taken in whichever layout its shape matches; one that matches neither is
refused by name. When the two layouts have the same shape (gate_up_proj with H == 2I,
down_proj with H == I) the shape cannot tell, so the tensor follows its sibling in the same
layer (down_proj for gate_up_proj and back): a checkpoint writes both projections one way,
and the two are never ambiguous together (that would need H == 2I and H == I). This is
sounder than provenance (transformers' own loader keeps an ambiguous tensor as stored,
which reads a published-layout checkpoint wrongly).

Under tensor parallelism a rank reads only its columns of every expert's intermediate
dimension (`expert_shard`), in any layout: each expert's slices, or the stacked tensor's.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

import torch

from llm_svc.engine.models.config import UnsupportedModelError
from llm_svc.engine.models.shard import Concatenated, Shard

GATE_UP, DOWN = "experts.gate_up_proj", "experts.down_proj"
STACKED = (GATE_UP, DOWN)
# FP8 experts' block scales (Fp8Experts), read only from per-expert `weight_scale_inv`s.
SCALE = "_scale_inv"
STACKED_SCALES = (GATE_UP + SCALE, DOWN + SCALE)

Shape = tuple[int, ...]
Sliceable = Any  # a tensor, a safetensors slice, or a Concatenated of them


def is_stacked_expert(name: str) -> bool:
    """True for a model parameter that holds all experts of one projection (or, for FP8
    experts, its block scales)."""
    return name.endswith(STACKED + STACKED_SCALES)


def read_expert_scales(
    stored: str, num_experts: int, available: Container[str], read: Callable[[str], torch.Tensor]
) -> torch.Tensor:
    """The stacked block scales of FP8 experts for `stored` (`...experts.gate_up_proj_scale_inv`
    or `...experts.down_proj_scale_inv`): each expert's `weight_scale_inv`, gate's grid then
    up's for gate_up, stacked over experts."""
    base = stored.rpartition("experts.")[0] + "experts."
    parts = ("gate_proj", "up_proj") if stored.endswith(STACKED_SCALES[0]) else ("down_proj",)
    names = [f"{base}{e}.{p}.weight_scale_inv" for e in range(num_experts) for p in parts]
    missing = [name for name in names if name not in available]
    if missing:
        raise ValueError(f"FP8 experts without block scales: no {missing[0]}")
    return torch.stack(
        [
            torch.cat([read(f"{base}{e}.{p}.weight_scale_inv") for p in parts])
            for e in range(num_experts)
        ]
    )


def expert_shard(name: str, span: tuple[int, int], intermediate: int) -> Shard:
    """Columns `span` of every expert's intermediate dimension (of `intermediate`) as a
    Shard of stacked parameter `name` in the internal layout: the span's rows of the gate
    half and of the up half of gate_up_proj [E, 2I, H] (dim 1), its columns of down_proj
    [E, H, I] (dim 2). The span (0, I) is the whole tensor."""
    start, stop = span
    if name.endswith("gate_up_proj"):
        return Shard.of(span, (intermediate + start, intermediate + stop), dim=1)
    return Shard.of(span, dim=2)


def expert_shape(name: str, num_experts: int, hidden: int, intermediate: int) -> Shape:
    """The whole (unsharded) internal shape of stacked parameter `name`."""
    if name.endswith(GATE_UP):
        return (num_experts, 2 * intermediate, hidden)
    return (num_experts, hidden, intermediate)


def _sibling(stored: str, expected: Shape) -> tuple[str, Shape]:
    """The other stacked projection of the same layer, with its expected internal shape."""
    experts, hidden_or_2i, last = expected
    if stored.endswith(GATE_UP):  # expected [E, 2I, H] → down_proj [E, H, I]
        return stored[: -len(GATE_UP)] + DOWN, (experts, last, hidden_or_2i // 2)
    return stored[: -len(DOWN)] + GATE_UP, (experts, 2 * last, hidden_or_2i)  # [E, H, I]


def stored_transposed(
    stored: str,
    expected: Shape,
    available: Container[str],
    shape_of: Callable[[str], Shape],
    *,
    ask_sibling: bool = True,
) -> bool:
    """Whether stacked tensor `stored` is kept transposed ([E, H, 2I] / [E, I, H]) rather
    than in the internal `expected` layout. UnsupportedModelError names the tensor when its
    shape fits neither layout, or when the layout cannot be told."""
    shape = tuple(shape_of(stored))
    transposed = (expected[0], expected[2], expected[1])
    if transposed != tuple(expected):
        if shape == tuple(expected):
            return False
        if shape == transposed:
            return True
        raise UnsupportedModelError(
            f"{stored} has shape {shape}; expected {tuple(expected)} (stacked as transformers "
            f"holds it) or {transposed} (stacked transposed, as Qwen3-VL-MoE publishes it)"
        )
    if shape != transposed:
        raise UnsupportedModelError(
            f"{stored} has shape {shape}; expected {transposed} (either stacked layout)"
        )
    sibling, sibling_expected = _sibling(stored, tuple(expected))
    if not ask_sibling or sibling not in available:
        raise UnsupportedModelError(
            f"{stored} has shape {shape}, the same in both stacked expert layouts, and "
            f"{sibling} is not stacked beside it to tell which layout the checkpoint uses"
        )
    return stored_transposed(sibling, sibling_expected, available, shape_of, ask_sibling=False)


def read_experts(
    stored: str,
    expected: Shape,
    available: Container[str],
    open_slice: Callable[[str], Sliceable],
    shape_of: Callable[[str], Shape],
    shard: Shard | None = None,
) -> torch.Tensor:
    """The internal-layout tensor of `expected` shape ([E, 2I, H] or [E, H, I]) for
    checkpoint name `stored` (the model's parameter name with the checkpoint prefix), from
    whichever layout is `available`, or only its `shard` (`expert_shard`; None: the whole).
    `open_slice(name)` is a safetensors slice (`get_slice`): only the ranges asked for are
    read, and the result is allocated once (a stacked checkpoint's single range not at all:
    a view of what the reader gives)."""
    if stored in available:
        transposed = stored_transposed(stored, expected, available, shape_of)
        if shard is None:
            tensor = open_slice(stored)[(slice(None),)]
        else:  # its dims 1 and 2 swapped when stored transposed
            tensor = shard.along(3 - shard.dim if transposed else shard.dim).cut(open_slice(stored))
        return tensor.transpose(1, 2) if transposed else tensor
    is_gate_up = stored.endswith(GATE_UP)
    intermediate = expected[1] // 2 if is_gate_up else expected[2]
    if shard is None:
        shard = expert_shard(stored, (0, intermediate), intermediate)
    num_experts = expected[0]
    base = stored.rpartition("experts.")[0] + "experts."
    missing = [
        name
        for e in range(num_experts)
        for name in (f"{base}{e}.gate_proj.weight", f"{base}{e}.down_proj.weight")
        if name not in available
    ]
    if missing:
        raise ValueError(
            f"expert weights for {stored} are in neither layout: no {stored} and no "
            f"{missing[0]} (and {len(missing) - 1} more)"
        )
    parts = ("gate_proj", "up_proj") if is_gate_up else ("down_proj",)
    part_shape = (intermediate, expected[2]) if is_gate_up else tuple(expected[1:])

    def expert(e: int) -> Sliceable:
        """Expert `e`'s [2I, H] or [H, I], sliced as one tensor."""
        names = [f"{base}{e}.{part}.weight" for part in parts]
        for name in names:
            if tuple(shape_of(name)) != part_shape:
                raise ValueError(f"{name} has shape {tuple(shape_of(name))}, not {part_shape}")
        slices = [open_slice(name) for name in names]
        return slices[0] if len(slices) == 1 else Concatenated(slices, [intermediate] * 2)

    one = shard.along(shard.dim - 1)  # of one expert: its dims are the stack's after the first
    shape = list(expected)
    shape[shard.dim] = shard.size
    # An empty read tells the dtype, so the stack is allocated before anything is read.
    dtype = open_slice(f"{base}0.{parts[0]}.weight")[(slice(0, 0),)].dtype
    out = torch.empty(shape, dtype=dtype)
    for e in range(num_experts):
        one.cut(expert(e), out=out[e])
    return out
