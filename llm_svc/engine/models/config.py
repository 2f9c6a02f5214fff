"""The language model's shape, read from a local HF config.json (plain LM or VLM).

Everything that changes the math is read here, or refused here by name
(`UnsupportedModelError`): an option the engine would otherwise ignore must never be
served silently wrong. Which layers slide is read per family as transformers 5.24 reads it
(`sliding_layers`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from iris.models import text_family
from iris.models.quantization import QuantScheme, read_quantization
from iris.multimodal import AttentionLayer, LayerKind, layers_from_windows

FULL, SLIDING, LINEAR = "full", "sliding", "linear"
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "qwen3_vl_moe", "qwen3_5_moe")
QWEN3_VL_FAMILIES = ("qwen3_vl", "qwen3_vl_moe")
# Hybrid (Gated DeltaNet + gated full attention): Qwen3.5 and Qwen3.5-MoE, text or VLM.
HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_moe")
# transformers' Qwen3.5 text rotary embedding: its `mrope_section` when the config has none.
QWEN3_5_MROPE_SECTION = (11, 11, 10)
SUPPORTED_ROPE_TYPES = ("default", "mrope", "linear")
# Gemma 4's full-attention layers rotate a fraction of their dims ("proportional").
GEMMA4_ROPE_TYPES = ("default", "proportional")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


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

    def per_rank(self, size: int) -> LinearAttentionShape:
        """One tensor-parallel rank's share: 1/size of the key heads and of the value heads
        (checks.py refuses a size that does not divide the key heads)."""
        return replace(
            self,
            num_key_heads=self.num_key_heads // size,
            num_value_heads=self.num_value_heads // size,
        )


@dataclass(frozen=True)
class Rope:
    """One rotary embedding: base `theta`, and `linear_factor` > 1 for linear scaling
    (positions divided by it, as HF's "linear" rope type does). `rotated` < 1 is Gemma 4's
    proportional rope: only the first `rotated` share of the frequency bands turn (their
    exponents still over the whole head_dim), the others keep frequency 0."""

    theta: float
    linear_factor: float = 1.0
    rotated: float = 1.0


@dataclass(frozen=True)
class KVShape:
    """The K/V of one attention layer: `num_kv_heads` heads of `head_dim` each."""

    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class MoeConfig:
    """A mixture-of-experts MLP: `num_experts` gated experts of width `intermediate_size`,
    `top_k` of them per token. A layer is sparse iff it is not in `mlp_only_layers` and
    (index + 1) % `decoder_sparse_step` == 0; other layers get the dense MLP.
    `shared_expert_size` > 0: Qwen2-MoE's shared expert behind a sigmoid gate."""

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_size: int = 0

    def is_sparse(self, layer: int) -> bool:
        step = self.decoder_sparse_step
        return layer not in self.mlp_only_layers and step > 0 and (layer + 1) % step == 0


@dataclass(frozen=True)
class TextModelConfig:
    """Everything the decoder needs; `mrope_section` is set for Qwen2-VL style M-RoPE.

    `layer_types[i]` is FULL or SLIDING; a sliding layer lets a query at position q see the
    keys at k with q - k < `sliding_window`. `ropes` maps each layer kind to its rotary
    embedding (Gemma 3's differ; everyone else's are the same)."""

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
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    ropes: dict[str, Rope] | None = None
    hidden_act: str = "silu"
    moe: MoeConfig | None = None
    # Gemma 3: softmax scale is query_pre_attn_scalar ** -0.5 instead of head_dim ** -0.5.
    query_pre_attn_scalar: float | None = None
    # Qwen3-VL: M-RoPE frequency bands interleaved t h w t h w ... instead of in blocks,
    # and the deepstack levels each image row carries after its main row.
    mrope_interleaved: bool = False
    deepstack_levels: int = 0
    # Gemma 4: each layer kind's K/V shape (full layers are wider), when they differ from
    # (num_kv_heads, head_dim); `kv_sources[i]` is the layer whose KV layer i reads (itself,
    # or for a KV-shared layer the last earlier layer of its kind that stores KV).
    kv_shapes: dict[str, KVShape] | None = None
    kv_sources: tuple[int, ...] = ()
    attention_k_eq_v: bool = False
    double_wide_mlp: bool = False
    final_logit_softcapping: float | None = None
    # Gemma 4's per-layer embeddings (PLE): each layer's input slice has this width (0: none),
    # from a table of `per_layer_vocab_size` rows; image positions read `pad_token_id`'s row.
    per_layer_input_size: int = 0
    per_layer_vocab_size: int = 0
    pad_token_id: int = 0

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else FULL

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`, None for a full-attention layer."""
        return self.sliding_window if self.layer_type(layer) == SLIDING else None

    def rope(self, kind: str) -> Rope:
        return (self.ropes or {}).get(kind) or Rope(self.rope_theta)

    def kv_shape(self, kind: str) -> KVShape:
        """The K/V shape of `kind`'s layers."""
        return (self.kv_shapes or {}).get(kind) or KVShape(self.num_kv_heads, self.head_dim)

    def kv_source(self, layer: int) -> int:
        """The layer whose KV `layer` attends to (itself unless it reuses another's)."""
        return self.kv_sources[layer] if self.kv_sources else layer

    def kv_layers(self, kind: str) -> list[int]:
        """The layers of `kind` that compute and keep their own KV (pages are theirs)."""
        return [
            i for i in range(self.num_layers)
            if self.layer_type(i) == kind and self.kv_source(i) == i
        ]  # fmt: skip

    # Hybrid models (Qwen3.5): the Gated DeltaNet layers' shape (their kind is LINEAR).
    linear: LinearAttentionShape | None = None
    partial_rotary_factor: float = 1.0

    @property
    def is_hybrid(self) -> bool:
        return self.linear is not None

    @property
    def num_linear_layers(self) -> int:
        return sum(kind == LINEAR for kind in self.layer_types)

    @property
    def num_kv_layers(self) -> int:
        """Layers that keep KV pages: not the linear ones, nor those reusing another's KV."""
        shared = sum(self.kv_source(i) != i for i in range(self.num_layers))
        return self.num_layers - self.num_linear_layers - shared

    def resume_layers(self, snapshot_interval: int) -> tuple[AttentionLayer, ...]:
        """The decoder's layers as the resumable-prefix rule sees them: full or sliding
        attention, or linear layers resumable every `snapshot_interval` pages (a state
        snapshot)."""
        if not self.is_hybrid:
            return layers_from_windows([self.window(i) for i in range(self.num_layers)])
        linear = AttentionLayer(LayerKind.LINEAR, snapshot_interval=snapshot_interval)
        return tuple(linear if kind == LINEAR else AttentionLayer() for kind in self.layer_types)

    @property
    def widest_mlp(self) -> int:
        """The widest dense MLP of any layer (Gemma 4's KV-shared layers' may be double)."""
        shared = any(self.kv_source(i) != i for i in range(self.num_layers))
        return self.intermediate_size * (2 if self.double_wide_mlp and shared else 1)

    @property
    def step_extra_width(self) -> int:
        """Values per token a Gemma 4 step holds beyond a dense layer's (the CPU step-peak
        estimate): its per-layer inputs (the projection, the table rows and their sum,
        each layers × P, live through the whole forward) and its routed experts (each of
        the top k: the gathered row, gate/up, their product, the down output)."""
        if self.family != "gemma4":
            return 0
        width = 3 * self.num_layers * self.per_layer_input_size
        if self.moe is not None:
            width += self.moe.top_k * (2 * self.hidden_size + 3 * self.moe.intermediate_size)
        return width

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

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
            family = text_family(architecture, raw)  # the one registry (iris/models/registry.py)
        except ValueError as err:
            raise UnsupportedModelError(str(err)) from None
        text = raw.get("text_config") or raw
        refuse_unsupported_options(architecture, family, raw, text)
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        heads = text["num_attention_heads"]
        section = rope.get("mrope_section")
        if family in HYBRID_FAMILIES:
            # The VLM's positions are M-RoPE ([3, T] with images); a text-only model's three
            # rows are always equal, which is plain RoPE on the rotary dims.
            section = (section or QWEN3_5_MROPE_SECTION) if "vision_config" in raw else None
        types = sliding_layers(architecture, family, text)
        ropes = read_ropes(family, text)
        quantization = read_quantization(raw)
        gemma4_moe = family == "gemma4" and bool(text.get("enable_moe_block"))
        has_experts = family in MOE_FAMILIES or gemma4_moe
        if quantization is not None and has_experts and quantization.block is None:
            raise UnsupportedModelError(
                f"FP8 experts with {quantization.method!r} {quantization.strategy} scales "
                f"({architecture}) are not supported; FP8 experts are served block-wise "
                "(quant_method 'fp8', weight_block_size)"
            )
        gemma4 = _read_gemma4(architecture, text, types) if family == "gemma4" else {}
        linear = _linear_shape(text, family)
        partial = float(rope.get("partial_rotary_factor", 1.0)) if linear else 1.0
        head_dim = text.get("head_dim") or text["hidden_size"] // heads
        if linear and section and 2 * sum(section) != int(head_dim * partial):
            raise UnsupportedModelError(
                f"{architecture}: mrope_section {list(section)} must cover the "
                f"{int(head_dim * partial) // 2} rotary frequencies (head_dim {head_dim} x "
                f"partial_rotary_factor {partial} / 2)"
            )
        return cls(
            architecture=architecture,
            family=family,
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            intermediate_size=_intermediate_size(family, text),
            num_layers=text["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=text.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            rope_theta=ropes[FULL].theta,
            max_position_embeddings=text.get("max_position_embeddings", 4096),
            # VLMs keep the flag at the top level, plain LMs in the (only) config.
            tie_word_embeddings=bool(
                raw.get(
                    "tie_word_embeddings",
                    text.get("tie_word_embeddings", family in ("gemma3", "gemma4")),
                )
            ),
            attention_bias=_attention_bias(family, text),
            mrope_section=tuple(section) if section else None,
            eos_token_ids=_eos_ids(model_dir, raw, text),
            quantization=quantization,
            layer_types=types,
            sliding_window=_window(family, text) if SLIDING in types else None,
            ropes=ropes,
            hidden_act=text.get("hidden_activation") or text.get("hidden_act") or "silu",
            moe=_read_moe(family, text),
            query_pre_attn_scalar=text.get("query_pre_attn_scalar") if family == "gemma3" else None,
            linear=linear,
            partial_rotary_factor=partial,
            # transformers' Qwen3-VL and Qwen3.5 interleave whatever `mrope_interleaved` says.
            mrope_interleaved=family in QWEN3_VL_FAMILIES + HYBRID_FAMILIES,
            deepstack_levels=_deepstack_levels(family, raw),
            **gemma4,
        )


def _attention_bias(family: str, text: dict) -> bool:
    if family == "qwen2_moe":
        return bool(text.get("qkv_bias", True))
    return bool(text.get("attention_bias", family == "qwen2"))


def refuse_unsupported_options(architecture: str, family: str, raw: dict, text: dict) -> None:
    """UnsupportedModelError naming the first option that changes the math and that the
    engine does not implement."""
    if family == "gemma4":
        _refuse_gemma4_options(architecture, text)
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        value = text.get(name, raw.get(name))
        if value is not None and not (family == "gemma4" and name == "final_logit_softcapping"):
            raise UnsupportedModelError(f"{architecture}: {name}={value} is not supported")
    # Gemma 4's "vision" only opens image spans on sliding layers: a text-only model has none.
    if text.get("use_bidirectional_attention") and family != "gemma4":
        raise UnsupportedModelError(
            f"{architecture}: use_bidirectional_attention=true is not supported"
        )
    for name in ("attention_chunk_size", "no_rope_layers"):
        if text.get(name):
            raise UnsupportedModelError(
                f"{architecture}: {name}={text[name]} (chunked attention) is not supported"
            )
    act = text.get("hidden_activation") or text.get("hidden_act") or "silu"
    if act not in SUPPORTED_ACTIVATIONS:
        raise UnsupportedModelError(
            f"{architecture}: activation {act!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ACTIVATIONS)})"
        )
    for kind, params in _rope_dicts(text).items():
        rope_type = params.get("rope_type", params.get("type", "default"))
        supported = GEMMA4_ROPE_TYPES if family == "gemma4" else SUPPORTED_ROPE_TYPES
        if rope_type not in supported:
            where = f" ({kind} layers)" if kind else ""
            raise UnsupportedModelError(
                f"{architecture}: rope type {rope_type!r}{where} is not supported "
                f"(supported: {', '.join(supported)})"
            )
    if family in MOE_FAMILIES and text.get("num_experts", text.get("num_local_experts", 0)) < 1:
        raise UnsupportedModelError(f"{architecture}: num_experts must be >= 1")


def _rope_dicts(text: dict) -> dict[str, dict]:
    """Rope parameter dicts by layer kind ("" when one dict serves every layer)."""
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if "full_attention" in rope or "sliding_attention" in rope:
        return {kind: params or {} for kind, params in rope.items()}
    return {"": rope}


def _rope_of(params: dict, theta: float) -> Rope:
    rope_type = params.get("rope_type", params.get("type", "default"))
    factor = float(params.get("factor", 1.0)) if rope_type == "linear" else 1.0
    return Rope(float(params.get("rope_theta", theta)), factor)


def read_ropes(family: str, text: dict) -> dict[str, Rope]:
    """{FULL: rope, SLIDING: rope}. Gemma 3 keeps one per layer kind (transformers 5's
    `rope_parameters` by kind, or the older `rope_theta` + `rope_local_base_freq` with
    `rope_scaling` applying to the global layers only)."""
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if family == "gemma4":
        return _gemma4_ropes(rope)
    if family == "gemma3":
        if "full_attention" in rope or "sliding_attention" in rope:
            full = _rope_of(rope.get("full_attention") or {}, 1_000_000.0)
            local = _rope_of(rope.get("sliding_attention") or {}, 10_000.0)
        else:
            full = _rope_of(rope, float(text.get("rope_theta", 1_000_000.0)))
            local = Rope(float(text.get("rope_local_base_freq", 10_000.0)))
        return {FULL: full, SLIDING: local}
    one = _rope_of(rope, float(text.get("rope_theta", 10000.0)))
    return {FULL: one, SLIDING: one}


def sliding_layers(architecture: str, family: str, text: dict) -> tuple[str, ...]:
    """Each layer's kind (FULL or SLIDING), by the rule transformers 5.24 applies to the
    family (tests/llm_svc/test_layer_kinds.py checks it against transformers' own code):

    - Gemma 3: `layer_types`, else every `sliding_window_pattern`-th layer (default 6) full;
    - Qwen2 / Qwen3 (dense): when `use_sliding_window`, `layer_types` if present, else the
      layers from `max_window_layers` on;
    - Qwen2-MoE: when `use_sliding_window`, `layer_types` if present, else the even layers
      below `max_window_layers`;
    - Qwen3-MoE: every layer, when `use_sliding_window`;
    - Mistral: every layer, when `sliding_window` is set.
    Published Qwen configs carry a `sliding_window` with `use_sliding_window: false`:
    those are full attention."""
    n = text["num_hidden_layers"]
    window = text.get("sliding_window")
    listed = text.get("layer_types")

    def from_list() -> tuple[str, ...]:
        if len(listed) != n:
            raise UnsupportedModelError(f"layer_types has {len(listed)} entries for {n} layers")
        unknown = set(listed) - {"full_attention", "sliding_attention"}
        if unknown:
            raise UnsupportedModelError(f"{architecture}: layer types {sorted(unknown)}")
        return tuple(SLIDING if kind == "sliding_attention" else FULL for kind in listed)

    if family in HYBRID_FAMILIES:  # Gated DeltaNet layers between full-attention ones
        unknown = set(listed) - {"full_attention", "linear_attention"}
        if len(listed) != n or unknown:
            raise UnsupportedModelError(
                f"{architecture}: layer_types must be {n} of full_attention / "
                f"linear_attention, got {len(listed)} with {sorted(unknown)}"
            )
        return tuple(LINEAR if kind == "linear_attention" else FULL for kind in listed)
    if family == "gemma4":
        # transformers' default: 5 sliding layers in 6; the last layer is always full.
        default = tuple(SLIDING if (i + 1) % 6 else FULL for i in range(n))
        return (*(from_list() if listed else default)[:-1], FULL)
    if family == "gemma3":
        if not window:
            return (FULL,) * n
        if listed:
            return from_list()
        pattern = text.get("sliding_window_pattern", text.get("_sliding_window_pattern", 6))
        return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(n))
    if architecture == "MistralForCausalLM" or text.get("model_type") == "mistral":
        return (SLIDING if window else FULL,) * n
    if family in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if not text.get("use_sliding_window") or not window:
            return (FULL,) * n
        if family == "qwen3_moe":
            return (SLIDING,) * n
        if listed:
            return from_list()
        limit = text.get("max_window_layers", 28)
        if family == "qwen2_moe":
            return tuple(SLIDING if i % 2 == 0 and i < limit else FULL for i in range(n))
        return tuple(SLIDING if i >= limit else FULL for i in range(n))
    if window and text.get("use_sliding_window", True) and architecture != "LlamaForCausalLM":
        raise UnsupportedModelError(f"{architecture}: sliding_window={window} is not supported")
    return (FULL,) * n


def _window(family: str, text: dict) -> int | None:
    # transformers' Gemma 4 default when the config has none.
    return text.get("sliding_window", 512 if family == "gemma4" else None)


def _refuse_gemma4_options(architecture: str, text: dict) -> None:
    """Gemma 4 serves the dense text model, with or without per-layer embeddings."""
    if text.get("enable_moe_block"):
        for name in ("num_experts", "top_k_experts", "moe_intermediate_size"):
            if not text.get(name):
                raise UnsupportedModelError(
                    f"{architecture}: enable_moe_block=true needs {name} >= 1"
                )
    if text.get("use_bidirectional_attention") == "all":
        raise UnsupportedModelError(
            f"{architecture}: use_bidirectional_attention='all' is not supported"
        )
    for layer, overrides in (text.get("per_layer_config") or {}).items():
        unknown = set(overrides) - {"head_dim", "num_key_value_heads"}
        if unknown:
            raise UnsupportedModelError(
                f"{architecture}: per_layer_config[{layer}] sets {sorted(unknown)}, which is "
                "not supported (only head_dim and num_key_value_heads)"
            )


def _gemma4_ropes(rope: dict) -> dict[str, Rope]:
    """Gemma 4's rope per layer kind, with transformers' defaults for a missing one."""
    defaults = {
        FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        SLIDING: {"rope_type": "default", "rope_theta": 1e4},
    }
    ropes = {}
    for kind, name in ((FULL, "full_attention"), (SLIDING, "sliding_attention")):
        params = rope.get(name) or defaults[kind]
        rotated = 1.0
        if params.get("rope_type", "default") == "proportional":
            rotated = float(params.get("partial_rotary_factor", 1.0))
        factor = float(params.get("factor", 1.0))
        ropes[kind] = Rope(float(params["rope_theta"]), factor, rotated)
    return ropes


def _read_gemma4(architecture: str, text: dict, kinds: tuple[str, ...]) -> dict:
    """Gemma 4's per-kind K/V shapes (`per_layer_config`), which layers reuse which KV
    (`num_kv_shared_layers`), and its other options, as TextModelConfig fields."""
    n = len(kinds)
    base = KVShape(
        text.get("num_key_value_heads") or text["num_attention_heads"], text.get("head_dim", 256)
    )
    per_layer = {int(k): v for k, v in (text.get("per_layer_config") or {}).items()}
    shapes: dict[str, KVShape] = {}
    for layer, kind in enumerate(kinds):
        overrides = per_layer.get(layer, {})
        shape = KVShape(
            int(overrides.get("num_key_value_heads", base.num_kv_heads)),
            int(overrides.get("head_dim", base.head_dim)),
        )
        if shapes.setdefault(kind, shape) != shape:
            raise UnsupportedModelError(
                f"{architecture}: {kind} layers of different shapes ({shapes[kind]} and "
                f"{shape} at layer {layer}) are not supported"
            )
    if SLIDING not in kinds:
        raise UnsupportedModelError(f"{architecture}: a model without sliding layers")
    shared = int(text.get("num_kv_shared_layers") or 0)
    first_shared = n - shared
    sources = list(range(n))
    for layer in range(first_shared, n):
        earlier = [i for i in range(first_shared) if kinds[i] == kinds[layer]]
        if not earlier:
            raise UnsupportedModelError(
                f"{architecture}: KV-shared layer {layer} ({kinds[layer]}) has no earlier "
                f"{kinds[layer]} layer to read (num_kv_shared_layers={shared})"
            )
        sources[layer] = earlier[-1]
    softcap = text.get("final_logit_softcapping")
    # transformers' defaults: 256-wide per-layer inputs from a 262,144-row table.
    per_layer_input = int(text.get("hidden_size_per_layer_input", 256) or 0)
    return dict(
        per_layer_input_size=per_layer_input,
        per_layer_vocab_size=int(text.get("vocab_size_per_layer_input", 262_144))
        if per_layer_input
        else 0,
        pad_token_id=int(text.get("pad_token_id") or 0),
        kv_shapes=shapes,
        kv_sources=tuple(sources) if shared else (),
        attention_k_eq_v=bool(text.get("attention_k_eq_v", False)),
        double_wide_mlp=bool(text.get("use_double_wide_mlp", False)),
        final_logit_softcapping=float(softcap) if softcap is not None else None,
    )


def _deepstack_levels(family: str, raw: dict) -> int:
    """Qwen3-VL: one deepstack level per `vision_config.deepstack_visual_indexes` entry
    (vision-tower layers); level i is added after decoder layer i."""
    if family not in QWEN3_VL_FAMILIES:
        return 0
    levels = len((raw.get("vision_config") or {}).get("deepstack_visual_indexes") or ())
    layers = (raw.get("text_config") or raw)["num_hidden_layers"]
    if levels > layers:
        raise UnsupportedModelError(f"{levels} deepstack levels for {layers} decoder layers")
    return levels


def _intermediate_size(family: str, text: dict) -> int:
    """The dense MLP's width; Qwen3.5-MoE has no dense MLP (every layer is sparse), so its
    widest per-token MLP, the shared expert, stands in (the CPU step-peak estimate)."""
    if family == "qwen3_5_moe":
        return int(text["shared_expert_intermediate_size"])
    return int(text["intermediate_size"])


def _read_moe(family: str, text: dict) -> MoeConfig | None:
    if family == "gemma4":
        # Every layer gets the block (beside its dense MLP); the router always renormalises.
        if not text.get("enable_moe_block"):
            return None
        return MoeConfig(
            num_experts=int(text["num_experts"]),
            top_k=int(text["top_k_experts"]),
            intermediate_size=int(text["moe_intermediate_size"]),
            norm_topk_prob=True,
        )
    if family not in MOE_FAMILIES:
        return None
    if family == "qwen3_5_moe":
        return _qwen3_5_moe(text)
    return MoeConfig(
        num_experts=int(text.get("num_experts", text.get("num_local_experts", 0))),
        top_k=int(text["num_experts_per_tok"]),
        intermediate_size=int(text["moe_intermediate_size"]),
        # transformers' Qwen3-VL-MoE router always renormalises its top-k weights.
        norm_topk_prob=family == "qwen3_vl_moe" or bool(text.get("norm_topk_prob", False)),
        decoder_sparse_step=int(text.get("decoder_sparse_step", 1)),
        mlp_only_layers=tuple(text.get("mlp_only_layers") or ()),
        shared_expert_size=int(text.get("shared_expert_intermediate_size") or 0)
        if family == "qwen2_moe"
        else 0,
    )


def _qwen3_5_moe(text: dict) -> MoeConfig:
    """Qwen3.5-MoE as transformers 5.24 builds it: every layer sparse, the top-k weights
    always renormalised, and a shared expert behind a sigmoid gate on every layer. The
    Qwen3-MoE fields its config class drops would be ignored there: refused by name here
    when they would change which layers are sparse."""
    step = text.get("decoder_sparse_step", 1)
    if step != 1 or text.get("mlp_only_layers"):
        raise UnsupportedModelError(
            f"Qwen3.5-MoE: decoder_sparse_step={step}, mlp_only_layers="
            f"{text.get('mlp_only_layers')} are not supported (every layer is sparse)"
        )
    shared = int(text.get("shared_expert_intermediate_size") or 0)
    if shared < 1:
        raise UnsupportedModelError("Qwen3.5-MoE: shared_expert_intermediate_size must be >= 1")
    return MoeConfig(
        num_experts=int(text["num_experts"]),
        top_k=int(text["num_experts_per_tok"]),
        intermediate_size=int(text["moe_intermediate_size"]),
        norm_topk_prob=True,
        shared_expert_size=shared,
    )


def _linear_shape(text: dict, family: str) -> LinearAttentionShape | None:
    """The Gated DeltaNet layers' shape of a Qwen3.5 config (None for other families)."""
    if family not in HYBRID_FAMILIES:
        return None
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
    return shape


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
