"""From LLMSettings to a loaded engine (the one place the pod's settings meet EngineConfig)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from llm_svc.engine import EngineConfig, LLMEngine
from llm_svc.engine.grammar.workers import start_fork_server
from llm_svc.engine.kv_store import KVStoreConfig
from llm_svc.server.grammar_hook import grammar_worker_from_env
from llm_svc.settings import LLMSettings

log = logging.getLogger(__name__)
RANK_FAILED_EXIT = 3  # the pod's exit code when a tensor-parallel rank fails
GRAMMAR_READY_TIMEOUT_S = 120.0


def engine_config(settings: LLMSettings) -> EngineConfig:
    """The engine's configuration; raises ValueError naming a bad value."""
    if not settings.model:
        raise ValueError("no model directory: set IRIS_LLM_MODEL or pass --model")
    return EngineConfig(
        model_dir=Path(settings.model),
        model_revision=settings.model_revision,
        page_size=settings.page_size,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_batch_tokens,
        max_model_len=settings.max_model_len,
        num_pages=settings.kv_num_pages,
        kv_cache_bytes=settings.kv_cache_bytes,
        host_kv_bytes=settings.host_kv_bytes,
        kv_store=kv_store_config(settings),
        gpu_memory_utilization=settings.gpu_memory_utilization,
        memory_budget_bytes=settings.memory_budget_bytes,
        max_held_embedding_bytes=settings.max_held_embedding_bytes,
        device=settings.device,
        dtype=settings.dtype,
        enable_prefix_caching=settings.enable_prefix_caching,
        state_snapshot_interval=settings.state_snapshot_interval,
        linear_attention_kernels=settings.linear_attention_kernels,
        attention_backend=settings.attention_backend,
        overlap_scheduling=settings.overlap_scheduling,
        num_speculative_tokens=settings.num_speculative_tokens,
        speculative_method=settings.speculative_method,
        speculative_min_acceptance=settings.speculative_min_acceptance,
        speculative_max_batch=settings.speculative_max_batch,
        seed=settings.seed,
        # The pod's embeddings come from the cache service (docs/design/engine.md).
        cache_address=settings.cache_address,
        cache_tls=settings.tls(),
        embedding_wait_s=settings.embedding_wait_s,
        cache_timeout_s=settings.cache_timeout_s,
        grammar_max_bytes=settings.grammar_max_bytes,
        grammar_max_depth=settings.grammar_max_depth,
        grammar_compile_timeout_s=settings.grammar_compile_timeout_s,
        grammar_queue_timeout_s=settings.grammar_queue_timeout_s,
        grammar_failure_ttl_s=settings.grammar_failure_ttl_s,
        grammar_compile_threads=settings.grammar_compile_threads,
        grammar_cache_entries=settings.grammar_cache_entries,
        grammar_worker_module=grammar_worker_from_env(),
        tensor_parallel_size=settings.tensor_parallel_size,
        tensor_parallel_timeout_s=settings.tensor_parallel_timeout_s,
    )


def kv_store_config(settings: LLMSettings) -> KVStoreConfig | None:
    """The shared KV store's configuration (IRIS_LLM_KV_STORE_*), None when off."""
    if settings.kv_store == "off":
        return None
    return KVStoreConfig(
        kind=settings.kv_store,
        url=settings.kv_store_url,
        cluster_nodes=tuple(settings.kv_store_cluster_nodes),
        password=settings.kv_store_password or None,
        tls=settings.kv_store_tls,
        tls_verify=settings.kv_store_tls_verify,
        tls_ca_file=settings.kv_store_tls_ca_file,
        tls_cert_file=settings.kv_store_tls_cert_file,
        tls_key_file=settings.kv_store_tls_key_file,
        timeout_s=settings.kv_store_timeout_s,
        write_queue=settings.kv_store_write_queue,
        retry_s=settings.kv_store_retry_s,
    )


def build_engine(settings: LLMSettings) -> LLMEngine:
    """Load the model and size the KV cache (slow: call it off the event loop)."""
    import torch

    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("IRIS_LLM_DEVICE=cuda but no CUDA device is available")
    if settings.grammar_workers_at_start:
        # The grammar fork server imports torch and xgrammar (seconds): let it do so while
        # the model loads, rather than after.
        start_fork_server()
    engine = LLMEngine(engine_config(settings))
    # Compile workers start with the pod, not with its first schema, and the pod is ready
    # only once one is: a structured request right after start does not wait for them.
    # (Without `grammar_workers_at_start` the pool starts them at its first constraint.)
    if settings.grammar_workers_at_start and not engine.grammars.wait_ready(
        GRAMMAR_READY_TIMEOUT_S
    ):
        log.warning(
            "no grammar compile worker is ready after %g s; structured output waits for one",
            GRAMMAR_READY_TIMEOUT_S,
        )
    if settings.tensor_parallel_size > 1:
        engine.runner.on_failure = end_pod
    return engine


def end_pod(message: str) -> None:
    """A tensor-parallel rank died or hung: no step can run again, and requests would wait
    forever, so the pod exits at once (non-zero) and its supervisor or Kubernetes restarts
    it; the other ranks die with it."""
    log.critical("ending the pod: %s", message)
    logging.shutdown()
    os._exit(RANK_FAILED_EXIT)
