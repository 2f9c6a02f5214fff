"""Decoder families by name: `build_decoder(config)` builds `config.family`'s model.

The architecture → family map is iris/models/registry.py (shared with the gateway); this
is the family → builder map of the engine. An unknown family is refused by name, listing
the supported ones.
"""

from __future__ import annotations

from collections.abc import Callable

from llm_svc.engine.models import (
    gemma3,
    gemma4,
    llama,
    qwen2_moe,
    qwen3,
    qwen3_5,
    qwen3_moe,
    qwen3_vl,
)
from llm_svc.engine.models.config import TextModelConfig, UnsupportedModelError
from llm_svc.engine.models.decoder import DecoderLM

FAMILIES: dict[str, Callable[[TextModelConfig], DecoderLM]] = {
    "llama": llama.build,
    "qwen2": llama.build,
    "qwen3": qwen3.build,
    "qwen3_moe": qwen3_moe.build,
    "qwen2_moe": qwen2_moe.build,
    "gemma3": gemma3.build,
    "gemma4": gemma4.build,
    "qwen3_5": qwen3_5.build,
    "qwen3_5_moe": qwen3_5.build,
    "qwen3_vl": qwen3_vl.build,
    "qwen3_vl_moe": qwen3_vl.build,
}


def supported_families() -> list[str]:
    return sorted(FAMILIES)


def build_decoder(config: TextModelConfig) -> DecoderLM:
    """The (un-loaded) decoder of `config.family`; UnsupportedModelError naming the
    supported families for any other."""
    try:
        build = FAMILIES[config.family]
    except KeyError:
        raise UnsupportedModelError(
            f"decoder family {config.family!r} ({config.architecture}) is not supported "
            f"(supported: {', '.join(supported_families())})"
        ) from None
    return build(config)
