"""Qwen3.5's multi-token-prediction (MTP) layer, loaded from the checkpoint's `mtp.*`.

transformers' Qwen3.5 has no MTP module and its config no MTP field, so the layer count is
read from the checkpoint's `mtp.layers.<i>.*` tensors. The layer (vLLM's `qwen3_5_mtp`
layout) predicts the token after next: at position i it takes the target's last hidden
state h_i (after the final norm) and the embedding of token i + 1, each RMS-normed
(`pre_fc_norm_hidden`, `pre_fc_norm_embedding`), concatenates them (embedding first),
projects them back to the hidden size (`fc`, no bias), runs one full-attention Qwen3.5
decoder layer (`layers.0.*`: gated attention, then the MLP or the experts) and the final
`norm`; the logits are the target's LM head on that. Chaining feeds the layer its own
output as the next position's hidden state. The embedding and the LM head are the
target's, shared. Its KV is its own (`DenseKV`), never the target's pages."""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from llm_svc.engine.models.config import LINEAR, TextModelConfig
from llm_svc.engine.models.layers import GemmaRMSNorm, RotaryEmbedding
from llm_svc.engine.models.loader import building_in, load_weights, materialize
from llm_svc.engine.models.qwen3_5 import HybridLayer

_LAYER = re.compile(r"^mtp\.layers\.(\d+)\.")
PREFIX = "mtp."


def mtp_layer_count(model_dir: str | Path) -> int:
    """The MTP layers in `model_dir`'s safetensors (0: none)."""
    from safetensors import safe_open

    layers = set()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                match = _LAYER.match(name)
                if match:
                    layers.add(int(match.group(1)))
    return len(layers)


class DenseKV:
    """One sequence's MTP keys and values, contiguous ([capacity, kv_heads, d], grown by
    doubling), and the attention backend the MTP layer calls (`forward`, as the engine's
    backends are called): new keys are appended, each query sees the keys up to its own
    position. `truncate` drops the entries of drafted positions after a chain."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.length = 0

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        need = self.length + k.shape[0]
        if self.keys is None or need > self.keys.shape[0]:
            capacity = max(16, 2 * need)
            keys = k.new_empty(capacity, *k.shape[1:])
            values = v.new_empty(capacity, *v.shape[1:])
            if self.keys is not None:
                keys[: self.length] = self.keys[: self.length]
                values[: self.length] = self.values[: self.length]
            self.keys, self.values = keys, values
        self.keys[self.length : need] = k
        self.values[self.length : need] = v
        self.length = need

    def forward(self, layer: int, q, k, v, **_) -> torch.Tensor:
        """q [T, heads, d], k/v [T, kv_heads, d] (the T positions after the stored ones)
        → [T, heads, d]."""
        self._append(k, v)
        tokens, heads = q.shape[0], q.shape[1]
        keys, values = self.keys[: self.length], self.values[: self.length]
        groups = heads // keys.shape[1]
        keys = keys.repeat_interleave(groups, dim=1).transpose(0, 1)
        values = values.repeat_interleave(groups, dim=1).transpose(0, 1)
        # Query t sits at position length - tokens + t: it sees keys up to there.
        seen = torch.arange(self.length, device=q.device)[None, :]
        mask = seen <= torch.arange(self.length - tokens, self.length, device=q.device)[:, None]
        out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=mask)
        return out.transpose(0, 1)


class MTPLayer(nn.Module):
    """The `mtp.*` weights of a Qwen3.5 or Qwen3.5-MoE checkpoint (parameter names are the
    checkpoint's without `mtp.`)."""

    def __init__(self, config: TextModelConfig) -> None:
        super().__init__()
        self.config = config  # the target's: the loader reads its experts' shape from it
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = GemmaRMSNorm(hidden, eps)
        self.pre_fc_norm_hidden = GemmaRMSNorm(hidden, eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        full = next(i for i, kind in enumerate(config.layer_types) if kind != LINEAR)
        self.layers = nn.ModuleList([HybridLayer(config, full, 0)])
        self.norm = GemmaRMSNorm(hidden, eps)
        self.rotary = RotaryEmbedding(
            config.rotary_dim, config.rope_theta, config.mrope_section,
            mrope_interleaved=config.mrope_interleaved,
        )  # fmt: skip

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
                kv: DenseKV) -> torch.Tensor:  # fmt: skip
        """hidden, embeds [T, H] of T consecutive positions after those in `kv` (hidden
        state at i, embedding of token i + 1); positions [T] (or [3, T] with M-RoPE) →
        the normed output [T, H], whose LM-head logits predict token i + 2."""
        x = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], -1)
        cos, sin = self.rotary(positions, x.dtype)
        x = self.layers[0](self.fc(x), cos, sin, kv, None)
        return self.norm(x)


def load_mtp(model_dir: str | Path, config: TextModelConfig, dtype: torch.dtype,
             device: torch.device) -> MTPLayer:  # fmt: skip
    """`model_dir`'s first MTP layer, on `device` in `dtype` (Qwen3.5 checkpoints carry
    one; the engine chains it for every draft, as vLLM does)."""
    if config.quantization is not None:
        raise ValueError("speculative_method 'mtp' does not support quantized checkpoints yet")
    with building_in(dtype):
        layer = MTPLayer(config)
    layer = materialize(layer, device)
    load_weights(layer, model_dir, prefix=PREFIX)
    return layer.eval()
