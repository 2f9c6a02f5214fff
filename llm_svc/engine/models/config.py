"""The language model's shape, read from a local HF config.json (plain LM or VLM)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from iris.models import text_family
from iris.models.quantization import QuantScheme, read_quantization


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or one of its options is not supported by the engine."""


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
    # Qwen3-VL: M-RoPE bands interleaved t h w t h w ... (not in blocks), per-head q/k norms,
    # and the deepstack levels each image row carries after its main row.
    mrope_interleaved: bool = False
    qk_norm: bool = False
    deepstack_levels: int = 0
    # Qwen3-VL-MoE: experts, experts per token, expert width, sparse step, dense layers.
    moe: tuple[int, int, int, int, tuple[int, ...]] | None = None

    @property
    def embedding_width(self) -> int:
        """Width of one image embedding row as fetched: main row, then each deepstack level."""
        return self.hidden_size * (1 + self.deepstack_levels)

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
        qwen3_vl = family in ("qwen3_vl", "qwen3_vl_moe")
        vision = raw.get("vision_config") or {}
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
            # transformers' Qwen3-VL interleaves whatever `mrope_interleaved` says.
            mrope_interleaved=qwen3_vl,
            qk_norm=qwen3_vl,
            deepstack_levels=len(vision.get("deepstack_visual_indexes") or ()) if qwen3_vl else 0,
            moe=_moe(text) if family == "qwen3_vl_moe" else None,
        )


def _moe(text: dict) -> tuple[int, int, int, int, tuple[int, ...]]:
    # transformers' Qwen3-VL-MoE router always renormalises its top-k weights.
    return (
        int(text.get("num_experts", text.get("num_local_experts"))),
        int(text["num_experts_per_tok"]),
        int(text["moe_intermediate_size"]),
        int(text.get("decoder_sparse_step", 1)),
        tuple(text.get("mlp_only_layers") or ()),
    )


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
