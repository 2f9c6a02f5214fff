"""Building blocks the decoder families are made of (llm_svc/engine/models/<family>.py).

Parameter names mirror HF checkpoints (`q_proj`, `q_norm`, `gate_proj`, `experts`, ...),
so weights load by name once the checkpoint's prefix is stripped.

- Norms: `RMSNorm` (x̂·w, Llama/Qwen) and `GemmaRMSNorm` (x̂·(1 + w), computed in fp32).
- Rotary: `RotaryEmbedding` (rotate-half, optional linear scaling, optional M-RoPE).
- Attention: `Attention`, full or sliding-window (the window goes to the backend), with
  optional per-head q/k norms and an explicit softmax scale.
- MLPs: `GatedMLP` (act(gate(x)) · up(x), then down) and `SparseMoE` (llm_svc/engine/
  models/moe.py): a top-k router over gated experts, optionally with a shared expert.
- `PreNormDecoderLayer`: x + attn(norm(x)), then x + mlp(norm(x)) (Llama, Qwen families).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llm_svc.engine.attention.base import AttentionBackend

ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class RMSNorm(nn.Module):
    """Llama-style RMSNorm: weight · x̂, with x̂ normalised in fp32 and cast back first."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 == self.weight.dtype:
            # One fused op; the same math as below, where the casts are no-ops.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in fp32 whatever the weights' dtype, then round to x's dtype before the
        # weight, as the reference models do.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: x̂ · (1 + weight), all in fp32, then cast (the stored weight is the
    offset from 1, so it is initialised to zeros)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Everything in fp32 and one rounding at the end, as the reference does; the fused
        # op computes exactly that.
        scale = 1.0 + self.weight.float()
        return F.rms_norm(x.float(), scale.shape, scale, self.eps).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with base `theta`; `linear_factor` > 1 divides the frequencies
    (HF's "linear" rope type); with `mrope_section` (Qwen2-VL) positions are [3, T] and
    frequency band j takes its angle from position row `section_of[j]` (temporal, height,
    width): in blocks (t…t h…h w…w, Qwen2-VL), or with `mrope_interleaved` (Qwen3-VL)
    t h w t h w …, band j reading h when j % 3 == 1 and j < 3·section[1], w when
    j % 3 == 2 and j < 3·section[2], t otherwise. `rotated` < 1 (Gemma 4's proportional
    rope) keeps only the first ⌊rotated·head_dim / 2⌋ bands turning, the rest at frequency
    0 (cos 1, sin 0: those dims pass unrotated). Holds no parameters or buffers: the fp32
    frequencies are computed on first use per device, so a model built on the meta device
    needs no re-initialisation."""

    def __init__(
        self,
        head_dim: int,
        theta: float,
        mrope_section: tuple[int, ...] | None = None,
        linear_factor: float = 1.0,
        mrope_interleaved: bool = False,
        rotated: float = 1.0,
    ):
        super().__init__()
        self.head_dim, self.theta, self.linear_factor = head_dim, theta, linear_factor
        self.turning = int(rotated * head_dim // 2)
        self.mrope = mrope_section is not None
        if self.mrope and sum(mrope_section) != head_dim // 2:
            raise ValueError(f"mrope_section {mrope_section} must sum to {head_dim // 2}")
        self.mrope_section, self.mrope_interleaved = mrope_section, mrope_interleaved
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def _table(self, device: torch.device):
        if device not in self._tables:
            exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
            inv_freq = (1.0 / self.theta**exponents) / self.linear_factor
            inv_freq[self.turning :] = 0.0
            section_of = None
            if self.mrope:
                section_of = torch.tensor(self._band_rows(), device=device)
            self._tables[device] = (inv_freq.to(device), section_of)
        return self._tables[device]

    def _band_rows(self) -> list[int]:
        """The position row (0 t, 1 h, 2 w) each of the head_dim / 2 bands reads."""
        section = self.mrope_section
        if not self.mrope_interleaved:
            return [row for row, width in enumerate(section) for _ in range(width)]
        return [
            band % 3 if band % 3 and band < 3 * section[band % 3] else 0
            for band in range(self.head_dim // 2)
        ]

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        """positions [T] (or [3, T] with M-RoPE) → cos, sin [T, head_dim] in `dtype`."""
        inv_freq, section_of = self._table(positions.device)
        if self.mrope:
            if positions.dim() == 1:
                positions = positions.expand(3, -1)
            angles = positions.float()[:, :, None] * inv_freq  # [3, T, d/2]
            index = section_of[None, None, :].expand(1, angles.shape[1], -1)
            angles = angles.gather(0, index).squeeze(0)
        else:
            if positions.dim() != 1:
                raise ValueError(f"positions must be [T] for this model, got {positions.shape}")
            angles = positions.float()[:, None] * inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d]; cos/sin [T, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    """Self-attention of one layer over the paged cache.

    q/k/v projections (bias optional), optional per-head `q_norm`/`k_norm` (a norm class,
    applied before RoPE, as Qwen3 and Gemma 3 do), RoPE, then the backend with this layer's
    `window` (None: full attention; W: a query at q sees keys at k with q - k < W) and
    softmax `scale` (None: head_dim ** -0.5). Tensor parallelism replaces the projections
    and `num_heads`/`num_kv_heads` in place (llm_svc/engine/parallel/sharding.py)."""

    def __init__(
        self,
        layer: int,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        bias: bool = False,
        qk_norm: type[nn.Module] | None = None,
        norm_eps: float = 1e-6,
        window: int | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        self.layer, self.window, self.scale = layer, window, scale
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.q_norm = self.k_norm = None
        if qk_norm is not None:
            self.q_norm = qk_norm(head_dim, norm_eps)
            self.k_norm = qk_norm(head_dim, norm_eps)

    def forward(self, x, cos, sin, backend: AttentionBackend) -> torch.Tensor:
        tokens = x.shape[0]
        q = self.q_proj(x).view(tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = backend.forward(self.layer, q, k, v, scale=self.scale, window=self.window)
        return self.o_proj(out.reshape(tokens, -1))


class GatedMLP(nn.Module):
    """Gated feed-forward: down(act(gate(x)) * up(x)); `act` is "silu" (SwiGLU) or
    "gelu_pytorch_tanh" (GeGLU, Gemma)."""

    def __init__(self, hidden: int, intermediate: int, act: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class PreNormDecoderLayer(nn.Module):
    """x + attn(input_layernorm(x)), then x + mlp(post_attention_layernorm(x))."""

    def __init__(self, attn: Attention, mlp: nn.Module, hidden: int, eps: float) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = attn
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = mlp

    def forward(self, x, cos, sin, backend: AttentionBackend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, backend)
        return x + self.mlp(self.post_attention_layernorm(x))
