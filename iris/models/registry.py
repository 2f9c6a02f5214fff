"""The one registry of architectures, keyed by the HF config's `architectures` entry.

A vision-language architecture has an adapter (iris/models/<family>/adapter.py, `@register`)
that also names its language model's decoder family; a plain language model has only its
decoder family (`_PLAIN_LANGUAGE_MODELS`), and `load_adapter` gives it the text-only adapter
(iris/models/text_only.py), which is not registered: `has_adapter` means "takes images".
The engine builds the decoder from the family; the gateway loads either adapter; the
encoder serves only a registered one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from iris.models.checkpoint import read_config
from iris.models.quantization import check_quantization

if TYPE_CHECKING:
    from iris.models.base import ModelAdapter

_REGISTRY: dict[str, type[ModelAdapter]] = {}


class UnsupportedModelError(ValueError):
    """A checkpoint's architecture or one of its options that Iris refuses, by name."""


# Architectures refused by name, with what to serve instead.
_REFUSED = {
    "InternVLChatModel": "the remote-code InternVL layout is not supported; serve the "
    "transformers (-HF) checkpoint, InternVLForConditionalGeneration",
}

# Plain language models (no images, no adapter) → the decoder family the engine builds.
_PLAIN_LANGUAGE_MODELS = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Gemma3ForCausalLM": "gemma3",
    # Gemma 4 part 1: the dense text model (llm_svc/engine/models/gemma4.py).
    "Gemma4ForCausalLM": "gemma4",
    # Hybrid: Gated DeltaNet linear attention with gated full attention every 4th layer.
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
}


def register(cls: type[ModelAdapter]) -> type[ModelAdapter]:
    """Class decorator: make an adapter serve each of its `architectures`."""
    for name in cls.architectures:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"architecture {name} is already served by {_REGISTRY[name].__name__}")
        _REGISTRY[name] = cls
    return cls


def _load_families() -> None:
    # Importing a family module registers it; kept here so the registry is always complete.
    import iris.models.gemma3.adapter  # noqa: F401
    import iris.models.gemma4.adapter  # noqa: F401
    import iris.models.idefics3.adapter  # noqa: F401
    import iris.models.internvl.adapter  # noqa: F401
    import iris.models.mistral3.adapter  # noqa: F401
    import iris.models.qwen2_vl.adapter  # noqa: F401
    import iris.models.qwen3_5.adapter  # noqa: F401
    import iris.models.qwen3_vl.adapter  # noqa: F401


def registered_architectures() -> list[str]:
    """The vision-language architectures (those with an adapter), sorted."""
    _load_families()
    return sorted(_REGISTRY)


def language_model_architectures() -> list[str]:
    """Every architecture the engine can run: the vision-language ones and plain LMs, sorted."""
    _load_families()
    return sorted({*_REGISTRY, *_PLAIN_LANGUAGE_MODELS})


def has_adapter(architecture: str) -> bool:
    """True for a vision-language architecture, False for a plain LM or an unknown name."""
    _load_families()
    return architecture in _REGISTRY


def text_family(architecture: str, config: dict | None = None) -> str:
    """The decoder family (llm_svc/engine/models/registry.py: "llama", "qwen2", "qwen3",
    "qwen3_moe", "qwen2_moe", "gemma3", "gemma4", "qwen3_5", "qwen3_5_moe", "qwen3_vl",
    "qwen3_vl_moe") of an architecture's language model, read from the checkpoint's
    `config` where the family's language model varies; UnsupportedModelError naming a
    refused architecture or option, ValueError listing every known architecture."""
    _load_families()
    _refuse_by_name(architecture)
    if architecture in _REGISTRY:
        adapter = _REGISTRY[architecture]
        return adapter.text_family_of(config) if config is not None else adapter.text_family
    try:
        return _PLAIN_LANGUAGE_MODELS[architecture]
    except KeyError:
        known = ", ".join(language_model_architectures())
        raise ValueError(f"unsupported architecture {architecture!r} (known: {known})") from None


def _refuse_by_name(architecture: str) -> None:
    if architecture in _REFUSED:
        raise UnsupportedModelError(f"{architecture}: {_REFUSED[architecture]}")


def adapter_class(architecture: str) -> type[ModelAdapter]:
    """The adapter class for one architecture name; ValueError listing the known ones."""
    _load_families()
    _refuse_by_name(architecture)
    try:
        return _REGISTRY[architecture]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(
            f"unsupported architecture {architecture!r} (registered: {known})"
        ) from None


def load_adapter(model_dir: str | Path, *, revision: str = "") -> ModelAdapter:
    """The adapter for a local HF model directory, its token contract and quantization
    already checked (the gateway, the encoder and the engine all load models through here
    or TextModelConfig, which make the same quantization check). `revision` names the
    weights for the fingerprint ("" = their digest)."""
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    check_quantization(config)
    architectures = config.get("architectures") or []
    if not architectures:
        known = ", ".join(registered_architectures())
        raise ValueError(f"{model_dir}/config.json has no 'architectures' (registered: {known})")
    if architectures[0] in _PLAIN_LANGUAGE_MODELS:
        from iris.models.text_only import TextOnlyAdapter

        adapter_cls: type[ModelAdapter] = TextOnlyAdapter
    else:
        adapter_cls = adapter_class(architectures[0])
    adapter_cls.text_family_of(config)  # refuses, by name, a language model not served
    adapter = adapter_cls(model_dir, config, revision=revision)
    adapter.check_token_contract()
    return adapter
