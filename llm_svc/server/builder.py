"""From LLMSettings to a loaded engine (the one place the pod's settings meet EngineConfig)."""

from __future__ import annotations

from pathlib import Path

from llm_svc.engine import EngineConfig, LLMEngine
from llm_svc.settings import LLMSettings


def engine_config(settings: LLMSettings) -> EngineConfig:
    """The engine's configuration; raises ValueError naming a bad value."""
    if not settings.model:
        raise ValueError("no model directory: set IRIS_LLM_MODEL or pass --model")
    return EngineConfig(
        model_dir=Path(settings.model),
        page_size=settings.page_size,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_batch_tokens,
        max_model_len=settings.max_model_len,
        num_pages=settings.kv_num_pages,
        kv_cache_bytes=settings.kv_cache_bytes,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        memory_budget_bytes=settings.memory_budget_bytes,
        max_held_embedding_bytes=settings.max_held_embedding_bytes,
        device=settings.device,
        dtype=settings.dtype,
        enable_prefix_caching=settings.enable_prefix_caching,
        attention_backend=settings.attention_backend,
        overlap_scheduling=settings.overlap_scheduling,
        seed=settings.seed,
        # The pod's embeddings come from the cache service (docs/design.md §3 step 5).
        cache_address=settings.cache_address,
        cache_tls=settings.tls(),
        embedding_wait_s=settings.embedding_wait_s,
        cache_timeout_s=settings.cache_timeout_s,
        grammar_max_bytes=settings.grammar_max_bytes,
        grammar_max_depth=settings.grammar_max_depth,
        grammar_compile_timeout_s=settings.grammar_compile_timeout_s,
        grammar_compile_threads=settings.grammar_compile_threads,
        grammar_cache_entries=settings.grammar_cache_entries,
    )


def build_engine(settings: LLMSettings) -> LLMEngine:
    """Load the model and size the KV cache (slow: call it off the event loop)."""
    import torch

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("IRIS_LLM_DEVICE=cuda but no CUDA device is available")
    return LLMEngine(engine_config(settings))
