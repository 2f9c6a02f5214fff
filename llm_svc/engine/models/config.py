"""The language model's shape, read from a local HF config.json (plain LM or VLM)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from iris.models import text_family
from iris.models.quantization import QuantScheme, read_quantization
from iris.multimodal import AttentionLayer, LayerKind


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or one of its options is not supported by the engine."""


@dataclass(frozen=True)
class LinearAttentionShape:
    """The Gated DeltaNet layers of a hybrid model (Qwen3.5): each sequence keeps, per layer,
    a conv state [conv_channels, conv_kernel - 1] and a recurrent state
    [num_value_heads, key_head_dim, value_head_dim]."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def conv_channels(self) -> int:
        keys = self.num_key_heads * self.key_head_dim
        return 2 * keys + self.num_value_heads * self.value_head_dim


@dataclass(frozen=True)
class TextModelConfig:
    """Everything the decoder needs; `mrope_section` is set for Qwen2-VL style M-RoPE."""

    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mrope_section: tuple[int, ...] | None
    eos_token_ids: tuple[int, ...]
    # FP8 layout of the checkpoint's linear layers (None: unquantized); any other
    # quantization is refused here, at load (iris/models/quantization.py).
    quantization: QuantScheme | None = None
    # Hybrid models: "linear_attention" | "full_attention" per layer (empty: all full).
    layer_types: tuple[str, ...] = ()
    linear: LinearAttentionShape | None = None
    partial_rotary_factor: float = 1.0

    @property
    def is_hybrid(self) -> bool:
        return self.linear is not None

    @property
    def num_linear_layers(self) -> int:
        return sum(kind == "linear_attention" for kind in self.layer_types)

    @property
    def num_kv_layers(self) -> int:
        """Layers that keep KV pages (the full-attention ones)."""
        return self.num_layers - self.num_linear_layers

    def resume_layers(self, snapshot_interval: int) -> tuple[AttentionLayer, ...]:
        """The decoder's layers as the resumable-prefix rule sees them: full attention, or
        linear layers resumable every `snapshot_interval` pages (a state snapshot)."""
        if not self.is_hybrid:
            return (AttentionLayer(),) * self.num_layers
        linear = AttentionLayer(LayerKind.LINEAR, snapshot_interval=snapshot_interval)
        return tuple(
            linear if kind == "linear_attention" else AttentionLayer() for kind in self.layer_types
        )

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> TextModelConfig:
        """Read config.json (and generation_config.json for EOS ids) from `model_dir`."""
        model_dir = Path(model_dir)
        raw = json.loads((model_dir / "config.json").read_text())
        architecture = (raw.get("architectures") or ["?"])[0]
        try:
            family = text_family(architecture)  # the one registry (iris/models/registry.py)
        except ValueError as err:
            raise UnsupportedModelError(str(err)) from None
        text = raw.get("text_config") or raw
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "mrope"):
            raise UnsupportedModelError(f"rope type {rope_type!r} is not supported")
        heads = text["num_attention_heads"]
        section = rope.get("mrope_section")
        layer_types, linear = _linear_layers(text, family)
        if linear is not None:
            section = None  # text-only: the three M-RoPE rows are equal, plain RoPE
        return cls(
            architecture=architecture,
            family=family,
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            intermediate_size=text["intermediate_size"],
            num_layers=text["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=text.get("num_key_value_heads") or heads,
            head_dim=text.get("head_dim") or text["hidden_size"] // heads,
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 10000.0))),
            max_position_embeddings=text.get("max_position_embeddings", 4096),
            # VLMs keep the flag at the top level, plain LMs in the (only) config.
            tie_word_embeddings=bool(
                raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
            ),
            attention_bias=bool(text.get("attention_bias", family == "qwen2")),
            mrope_section=tuple(section) if section else None,
            eos_token_ids=_eos_ids(model_dir, raw, text),
            quantization=read_quantization(raw),
            layer_types=layer_types,
            linear=linear,
            partial_rotary_factor=float(rope.get("partial_rotary_factor", 1.0)) if linear else 1.0,
        )


def _linear_layers(text: dict, family: str) -> tuple[tuple[str, ...], LinearAttentionShape | None]:
    """The hybrid layout of a Qwen3.5-style config (empty, None for a dense model); a layer
    type or activation the engine does not implement is refused by name."""
    if family != "qwen3_5":
        return (), None
    layer_types = tuple(text["layer_types"])
    unknown = sorted(set(layer_types) - {"linear_attention", "full_attention"})
    if unknown:
        raise UnsupportedModelError(f"layer_types {unknown} are not supported")
    if text.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"hidden_act {text['hidden_act']!r} is not supported")
    shape = LinearAttentionShape(
        num_key_heads=text["linear_num_key_heads"],
        num_value_heads=text["linear_num_value_heads"],
        key_head_dim=text["linear_key_head_dim"],
        value_head_dim=text["linear_value_head_dim"],
        conv_kernel=text["linear_conv_kernel_dim"],
    )
    if shape.num_value_heads % shape.num_key_heads:
        raise UnsupportedModelError(
            f"linear_num_value_heads {shape.num_value_heads} is not a multiple of "
            f"linear_num_key_heads {shape.num_key_heads}"
        )
    return layer_types, shape


def _eos_ids(model_dir: Path, raw: dict, text: dict) -> tuple[int, ...]:
    generation = model_dir / "generation_config.json"
    value = None
    if generation.is_file():
        value = json.loads(generation.read_text()).get("eos_token_id")
    if value is None:
        value = text.get("eos_token_id", raw.get("eos_token_id"))
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)
