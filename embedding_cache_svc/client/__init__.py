"""Client library of the embedding cache: `CacheClient` (blocking, for threads) and
`AsyncCacheClient` (grpc.aio), sharing one implementation (core.py), with an optional
in-process L1 tier (l1.py). torch is imported only when tensors are put or fetched."""

from embedding_cache_svc.client.aio import AsyncCacheClient
from embedding_cache_svc.client.errors import (
    CacheError,
    CacheInvalidArgument,
    CacheTimeout,
    CacheUnavailable,
)
from embedding_cache_svc.client.l1 import L1Cache
from embedding_cache_svc.client.sync import CacheClient
from embedding_cache_svc.entry import Failed, Status

__all__ = [
    "AsyncCacheClient",
    "CacheClient",
    "CacheError",
    "CacheInvalidArgument",
    "CacheTimeout",
    "CacheUnavailable",
    "Failed",
    "L1Cache",
    "Status",
]
