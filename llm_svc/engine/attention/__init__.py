"""Attention backends by name: `make_backend("sdpa", kv_cache)`."""

from __future__ import annotations

from llm_svc.engine.attention.base import AttentionBackend, AttentionMetadata, KVCache
from llm_svc.engine.attention.sdpa import SdpaBackend

BACKENDS: dict[str, type[AttentionBackend]] = {SdpaBackend.name: SdpaBackend}


def make_backend(name: str, kv_cache: KVCache) -> AttentionBackend:
    """The backend registered under `name`; an unknown name lists the supported ones."""
    try:
        return BACKENDS[name](kv_cache)
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; supported: {', '.join(sorted(BACKENDS))}"
        ) from None


__all__ = ["BACKENDS", "AttentionBackend", "AttentionMetadata", "KVCache", "make_backend"]
