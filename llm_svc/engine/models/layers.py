"""Building blocks shared by the Llama and Qwen2 decoders (names mirror HF checkpoints)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 whatever the weights' dtype, as the reference models do.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class GatedMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE; with `mrope_section` (Qwen2-VL) positions are [3, T] and frequency
    band j takes its angle from position row `section_of[j]` (temporal, height, width)."""

    def __init__(self, head_dim: int, theta: float, mrope_section: tuple[int, ...] | None):
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        self.register_buffer("inv_freq", 1.0 / theta**exponents, persistent=False)
        self.mrope = mrope_section is not None
        if self.mrope:
            if sum(mrope_section) != head_dim // 2:
                raise ValueError(f"mrope_section {mrope_section} must sum to {head_dim // 2}")
            rows = [row for row, width in enumerate(mrope_section) for _ in range(width)]
            self.register_buffer("section_of", torch.tensor(rows), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        """positions [T] (or [3, T] with M-RoPE) → cos, sin [T, head_dim] in `dtype`."""
        if self.mrope:
            if positions.dim() == 1:
                positions = positions.expand(3, -1)
            angles = positions.float()[:, :, None] * self.inv_freq  # [3, T, d/2]
            index = self.section_of[None, None, :].expand(1, angles.shape[1], -1)
            angles = angles.gather(0, index).squeeze(0)
        else:
            if positions.dim() != 1:
                raise ValueError(f"positions must be [T] for this model, got {positions.shape}")
            angles = positions.float()[:, None] * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d]; cos/sin [T, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
