"""Reading stacked expert weights from the two layouts published checkpoints use.

The engine holds `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I]
(llm_svc/engine/models/moe.py). Checkpoints store them either
- per expert, `experts.{e}.gate_proj.weight` [I, H], `.up_proj.weight` [I, H],
  `.down_proj.weight` [H, I] (Qwen2-MoE and Qwen3-MoE, as `save_pretrained` writes them), or
- stacked and transposed, `experts.gate_up_proj` [E, H, 2I] and `experts.down_proj`
  [E, I, H] (Qwen3-VL-MoE).
"""

from __future__ import annotations

from collections.abc import Callable, Container

import torch

STACKED = ("experts.gate_up_proj", "experts.down_proj")


def is_stacked_expert(name: str) -> bool:
    """True for a model parameter that holds all experts of one projection."""
    return name.endswith(STACKED)


def read_experts(
    stored: str,
    num_experts: int,
    available: Container[str],
    read: Callable[[str], torch.Tensor],
) -> torch.Tensor:
    """The full [E, 2I, H] or [E, H, I] tensor for checkpoint name `stored` (the model's
    parameter name with the checkpoint prefix), from whichever layout is `available`."""
    if stored in available:
        return read(stored).transpose(1, 2)  # stacked [E, H, 2I] / [E, I, H]
    base = stored.rpartition("experts.")[0] + "experts."
    if stored.endswith("gate_up_proj"):

        def one(e: int) -> torch.Tensor:
            gate = read(f"{base}{e}.gate_proj.weight")
            return torch.cat([gate, read(f"{base}{e}.up_proj.weight")])
    else:

        def one(e: int) -> torch.Tensor:
            return read(f"{base}{e}.down_proj.weight")

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
    return torch.stack([one(e) for e in range(num_experts)])
