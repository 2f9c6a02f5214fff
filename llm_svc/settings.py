"""Settings of an LLM pod (env prefix ``IRIS_LLM_``), read once at start."""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import SettingsConfigDict

from iris.metrics import CACHE_GRPC_PORT, LLM_GRPC_PORT, LLM_METRICS_PORT
from iris.settings import AddressList, GrpcServiceSettings


class LLMSettings(GrpcServiceSettings):
    """Everything `iris llm` reads from the environment.

    KV cache size: `kv_num_pages` if set, else as many pages as fit in `kv_cache_bytes`,
    else what the memory budget leaves (docs/design/engine.md): on CUDA
    `gpu_memory_utilization` × the GPU's memory − weights − a profiled step's peak −
    `max_held_embedding_bytes`; on CPU the same against `memory_budget_bytes` (unset: the
    KV cache gets 512 MiB). Image embeddings held by running requests stay under
    `max_held_embedding_bytes`: admission waits for some to be released.
    `max_batch_tokens` is the per-step token budget shared by decodes and prefill chunks,
    so it is also the largest prefill chunk. `max_waiting` bounds requests
    that are submitted but not yet admitted; beyond it Generate answers RESOURCE_EXHAUSTED
    with `retry_after_ms` as a hint. `pod_name` falls back to the Kubernetes downward-API
    variable POD_NAME, then the host name.
    """

    model_config = SettingsConfigDict(
        env_prefix="IRIS_LLM_", extra="forbid", validate_default=True, populate_by_name=True
    )

    model: str = ""  # local HF model directory (required to serve)
    # The weights' name (an HF commit hash, or any version the deployer gives; chart
    # `model.revision`): part of the fingerprint, so caches never mix two fine-tunes. Empty:
    # a BLAKE3 digest of the weight files stands for it (computed once per directory).
    model_revision: str = ""
    model_id: str = ""  # the name GetModelInfo reports; default: the directory's name
    cache_address: str = f"127.0.0.1:{CACHE_GRPC_PORT}"  # embedding cache (multimodal path)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    # "auto": Triton kernels on CUDA, SDPA on CPU (llm_svc.engine.attention.CHOICES).
    attention_backend: Literal["auto", "sdpa", "triton"] = "auto"
    port: int = Field(LLM_GRPC_PORT, ge=0, le=65535)
    metrics_port: int = Field(LLM_METRICS_PORT, ge=0, le=65535)
    pod_name: str = Field(
        default_factory=socket.gethostname,
        validation_alias=AliasChoices("IRIS_LLM_POD_NAME", "POD_NAME", "pod_name"),
    )

    # Engine
    page_size: int = Field(16, gt=0, le=1024)
    max_num_seqs: int = Field(64, gt=0)
    max_batch_tokens: int = Field(2048, gt=0)
    max_model_len: int | None = Field(None, gt=1)
    kv_cache_bytes: int | None = Field(None, gt=0)
    kv_num_pages: int | None = Field(None, gt=0)
    # Host memory (bytes, per rank) for the KV pages, window pages and state snapshots the
    # device pools let go: kept there and copied back on a hit instead of prefilled again;
    # 0: off. More than the host memory left to the pod is refused at start
    # (docs/design/engine.md, "KV tiers"; the chart's llm.hostKVBytes adds it to the pod's
    # memory request and limit).
    host_kv_bytes: int = Field(0, ge=0)
    # The KV store every pod shares (llm_svc/engine/kv_store.py; docs/design/running.md,
    # "KV store"): pages entering the host tier are written there, and a pod whose own
    # tiers miss loads them from it instead of prefilling. off | memory (a dict in this
    # process under the name `kv_store_url`: NOT shared between pods, for tests) | redis
    # (`kv_store_url`, redis:// or rediss://) | redis-cluster (`kv_store_cluster_nodes`,
    # host:port seeds, JSON or comma-separated). Needs the host tier (host_kv_bytes > 0).
    kv_store: Literal["off", "memory", "redis", "redis-cluster"] = "off"
    kv_store_url: str = ""
    kv_store_cluster_nodes: AddressList = []
    kv_store_password: str | None = None
    kv_store_tls: bool = False
    kv_store_tls_verify: bool = True
    kv_store_tls_ca_file: str | None = None
    kv_store_tls_cert_file: str | None = None
    kv_store_tls_key_file: str | None = None
    kv_store_timeout_s: float = Field(0.5, gt=0)  # per read or write round trip
    kv_store_write_queue: int = Field(1024, ge=1)  # pages waiting to be written; then dropped
    kv_store_retry_s: float = Field(5.0, ge=0)  # after a failure, left alone this long
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    memory_budget_bytes: int | None = Field(None, gt=0)  # CPU only: the pod's whole budget
    max_held_embedding_bytes: int = Field(1 << 30, gt=0)
    enable_prefix_caching: bool = True
    # Hybrid (linear-attention) models: a state snapshot every this many pages of a cached
    # prefix; larger costs less memory per page and resumes less deep (docs/design/engine.md).
    state_snapshot_interval: int = Field(16, gt=0)
    # Their gated delta rule: fla-core's Triton kernels on CUDA when installed (the `cuda`
    # extra), else torch; "torch" or "fla" forces one.
    linear_attention_kernels: Literal["auto", "torch", "fla"] = "auto"
    # Schedule step k+1 while step k runs on the device; unset: on for CUDA, off for CPU
    # (the host's own cores run the model there, so nothing overlaps: docs/design/engine.md).
    overlap_scheduling: bool | None = None
    # Speculative decoding (docs/design/engine.md): drafts per decoding sequence (0: off),
    # their method, the recent acceptance below which a sequence pauses drafting (0: never)
    # and the running batch from which decode is compute-bound and nobody drafts.
    num_speculative_tokens: int = Field(0, ge=0)
    speculative_method: Literal["ngram", "mtp"] = "ngram"
    speculative_min_acceptance: float = Field(0.3, ge=0, le=1)
    speculative_max_batch: int = Field(32, gt=0)
    seed: int = 0
    torch_threads: int = Field(0, ge=0)  # 0: leave torch's default
    # Tensor parallelism: ranks (one process and device each) that split the model, and how
    # long a collective may wait for a rank before the pod ends (docs/design/parallelism.md).
    tensor_parallel_size: int = Field(1, ge=1)
    tensor_parallel_timeout_s: float = Field(60.0, gt=0)

    # Embeddings (the multimodal path): how long admission waits for an item another
    # process is still encoding, and how long the cache may stay unreachable before a
    # request fails UNAVAILABLE.
    embedding_wait_s: float = Field(30.0, gt=0)
    cache_timeout_s: float = Field(5.0, gt=0)

    # Structured output (constraints compiled with xgrammar, off the engine loop): the
    # largest constraint text, its deepest JSON nesting, how long one compile may run (its
    # worker process is then killed and replaced), how long a request may wait for its
    # grammar (queue and compile together), how long a failed compile is remembered,
    # compile workers, compiled grammars kept.
    grammar_max_bytes: int = Field(64 << 10, gt=0)
    grammar_max_depth: int = Field(32, gt=0)
    grammar_compile_timeout_s: float = Field(3.0, gt=0)
    grammar_queue_timeout_s: float = Field(7.0, gt=0)
    grammar_failure_ttl_s: float = Field(300.0, gt=0)
    grammar_compile_threads: int = Field(2, gt=0)
    grammar_cache_entries: int = Field(256, gt=0)
    # Start the fork server and compile workers with the pod (it is ready once one is) or at
    # the first structured request (it then waits for their imports, about 3 s on a CPU):
    # the fork server and its three workers take about 300 MB of host memory (PSS) a pod.
    grammar_workers_at_start: bool = True

    # Serving
    max_waiting: int = Field(256, gt=0)
    retry_after_ms: int = Field(500, gt=0)
    kv_event_buffer: int = Field(65536, gt=0)  # events kept for subscribers that lag
    max_message_bytes: int = Field(64 << 20, ge=4 << 20)  # gRPC receive limit
    shutdown_grace_s: float = Field(5.0, ge=0)
    # Readiness (gRPC health): NOT_SERVING while the engine thread is dead, or has not
    # completed a step for `step_stall_s` while work waits; checked every interval.
    step_stall_s: float = Field(60.0, gt=0)
    health_interval_s: float = Field(1.0, gt=0)
    # Failed engine steps and probes in a row (no successful step between) before the pod
    # exits non-zero to be restarted; a device error (CUDA, not out-of-memory) exits at once.
    max_consecutive_step_failures: int = Field(3, ge=1)

    @model_validator(mode="after")
    def _kv_store_complete(self) -> LLMSettings:
        """A store needs its address and the host tier its pages are loaded into."""
        if self.kv_store == "redis" and not self.kv_store_url:
            raise ValueError(
                "kv_store redis (IRIS_LLM_KV_STORE) needs kv_store_url "
                "(IRIS_LLM_KV_STORE_URL, redis://host:port/db)"
            )
        if self.kv_store == "redis-cluster" and not self.kv_store_cluster_nodes:
            raise ValueError(
                "kv_store redis-cluster (IRIS_LLM_KV_STORE) needs at least one host:port "
                "seed in kv_store_cluster_nodes (IRIS_LLM_KV_STORE_CLUSTER_NODES)"
            )
        if self.kv_store != "off" and self.host_kv_bytes == 0:
            raise ValueError(
                f"kv_store {self.kv_store} (IRIS_LLM_KV_STORE) needs the host KV tier: set "
                f"host_kv_bytes (IRIS_LLM_HOST_KV_BYTES) > 0, its pages are loaded there"
            )
        return self
