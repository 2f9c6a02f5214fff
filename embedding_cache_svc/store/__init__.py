"""Stores behind the cache service, chosen by `CacheSettings.store`."""

from __future__ import annotations

from embedding_cache_svc.settings import CacheSettings

# What the service outside this package uses; store implementations import base directly.
from embedding_cache_svc.store.base import EntryVanished, Store, StoreStats, StoreUnavailable

STORES = ("memory", "redis", "redis-cluster")


def make_store(settings: CacheSettings) -> Store:
    """The store the settings name (memory: embedded LRU; redis, redis-cluster: shared)."""
    if settings.store == "memory":
        from embedding_cache_svc.store.memory import MemoryStore

        return MemoryStore(settings.memory_bytes, settings.ttl_s, settings.failed_ttl_s)
    if settings.store in ("redis", "redis-cluster"):
        from embedding_cache_svc.store.redis_store import RedisStore

        return RedisStore.from_settings(settings)
    raise ValueError(f"unknown cache store {settings.store!r}; supported: {', '.join(STORES)}")


__all__ = [
    "STORES",
    "EntryVanished",
    "Store",
    "StoreStats",
    "StoreUnavailable",
    "make_store",
]
