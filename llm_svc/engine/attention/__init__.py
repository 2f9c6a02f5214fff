"""Attention backends by name: `make_backend("auto", kv_cache)`.

"auto" is Triton for a CUDA cache and SDPA otherwise; "triton" or "sdpa" forces one. Triton
on a CPU cache needs Triton's interpreter (TRITON_INTERPRET=1, the tests' way). A model
whose head dim or dtype the Triton kernels do not cover gets SDPA, with one warning.
"""

from __future__ import annotations

import logging

from iris_kernels import interpreting
from iris_kernels.paged_attention_decode import unsupported_reason
from llm_svc.engine.attention.base import AttentionBackend, AttentionMetadata, KVCache
from llm_svc.engine.attention.sdpa import SdpaBackend
from llm_svc.engine.attention.triton import TritonBackend

log = logging.getLogger(__name__)

BACKENDS: dict[str, type[AttentionBackend]] = {
    SdpaBackend.name: SdpaBackend,
    TritonBackend.name: TritonBackend,
}
AUTO = "auto"
CHOICES = (AUTO, *sorted(BACKENDS))


def check_backend_name(name: str) -> None:
    """Raise ValueError naming the choices unless `name` is "auto" or a backend."""
    if name not in CHOICES:
        raise ValueError(f"unknown attention backend {name!r}; supported: {', '.join(CHOICES)}")


def resolve_backend_name(name: str, kv_cache: KVCache) -> str:
    """The backend `name` means for this cache: "auto" resolved, Triton's limits applied."""
    check_backend_name(name)
    device = kv_cache.k.device
    if name == AUTO:
        name = TritonBackend.name if device.type == "cuda" else SdpaBackend.name
    if name != TritonBackend.name:
        return name
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"attention backend 'triton' needs a CUDA device (the cache is on {device.type}) "
            "or TRITON_INTERPRET=1; use 'sdpa' or 'auto'"
        )
    reason = unsupported_reason(kv_cache.k.shape[-1], kv_cache.k.dtype)
    if reason:
        log.warning("attention backend 'triton' cannot serve this model (%s): using sdpa", reason)
        return SdpaBackend.name
    return name


def make_backend(name: str, kv_cache: KVCache) -> AttentionBackend:
    """The backend `name` selects for `kv_cache` (see `resolve_backend_name`)."""
    return BACKENDS[resolve_backend_name(name, kv_cache)](kv_cache)


__all__ = [
    "BACKENDS",
    "CHOICES",
    "AttentionBackend",
    "AttentionMetadata",
    "KVCache",
    "check_backend_name",
    "make_backend",
    "resolve_backend_name",
]
