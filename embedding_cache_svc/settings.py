"""Settings of the cache service (env prefix ``IRIS_CACHE_``), read once at start."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from iris.metrics import CACHE_GRPC_PORT, CACHE_METRICS_PORT
from iris.settings import AddressList, GrpcServiceSettings


class CacheSettings(GrpcServiceSettings):
    """Everything `iris cache` reads from the environment.

    TTLs of 0 mean "no expiry". `memory_bytes` bounds the memory store only; a Redis store
    is bounded by the server's own maxmemory (and its eviction policy). The redis-cluster
    store reaches the cluster through `redis_cluster_nodes` (seed ``host:port`` list, JSON
    or comma-separated) and shares the password, TLS and timeout settings of `redis`.

    Capacity counts bytes, not images: an entry of a model with deepstack levels (Qwen3-VL)
    holds the main rows and every level's, (1 + levels) x the bytes of a Qwen2-VL entry of
    as many tokens (4x for Qwen3-VL's 3 levels), so `memory_bytes`, Redis's maxmemory and
    `max_entry_bytes` hold (1 + levels) x fewer images.
    """

    model_config = SettingsConfigDict(
        env_prefix="IRIS_CACHE_", extra="forbid", validate_default=True
    )

    port: int = Field(CACHE_GRPC_PORT, ge=0, le=65535)
    metrics_port: int = Field(CACHE_METRICS_PORT, ge=0, le=65535)
    store: Literal["memory", "redis", "redis-cluster"] = "memory"
    memory_bytes: int = Field(2 << 30, gt=0)
    ttl_s: float = Field(3600.0, ge=0)
    failed_ttl_s: float = Field(30.0, gt=0)
    max_entry_bytes: int = Field(256 << 20, gt=0)
    # gRPC data message size of Get streams (below gRPC's 4 MiB default); messages under
    # glibc's mmap threshold cost no fresh page faults, which dominated 1 MiB messages.
    chunk_bytes: int = Field(256 << 10, ge=4096, le=3 << 20)
    max_lease_ms: int = Field(600_000, gt=0)
    max_wait_ms: int = Field(120_000, gt=0)
    max_batch_items: int = Field(4096, gt=0)
    # Redis
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_cluster_nodes: AddressList = []
    redis_password: str | None = None
    redis_tls: bool = False
    redis_tls_ca_file: str | None = None
    redis_tls_cert_file: str | None = None
    redis_tls_key_file: str | None = None
    redis_tls_verify: bool = True
    redis_connect_timeout_s: float = Field(0.5, gt=0)
    redis_op_timeout_s: float = Field(5.0, gt=0)
    redis_max_connections: int = Field(64, gt=0)
    redis_key_prefix: str = "iris:"
    # GETRANGE size of streaming reads: one round trip for entries up to 1 MiB (fewer
    # redis-py calls cost less than overlapping smaller reads with the sends).
    redis_read_bytes: int = Field(1 << 20, ge=4096)
    health_interval_s: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _cluster_needs_seeds(self) -> CacheSettings:
        if self.store == "redis-cluster" and not self.redis_cluster_nodes:
            raise ValueError(
                "redis_cluster_nodes (IRIS_CACHE_REDIS_CLUSTER_NODES) needs at least one "
                "host:port seed for store redis-cluster"
            )
        return self
