"""The cache service's Prometheus metrics (names from iris.metrics), in their own registry
so several servers can live in one process (tests)."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from embedding_cache_svc.proto import cache_pb2
from embedding_cache_svc.store import StoreStats
from iris import metrics as names

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class CacheMetrics:
    """Counters the servicer updates, plus gauges refreshed from the store's stats."""

    def __init__(self, store: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.store = store
        counter = functools.partial(Counter, registry=self.registry)
        gauge = functools.partial(Gauge, registry=self.registry)
        self.hits = counter(names.CACHE_HITS, "BatchGet items answered")
        self.misses = counter(names.CACHE_MISSES, "BatchGet items not answered")
        self.discards = counter(
            names.CACHE_DISCARDS,
            "Damaged entries the cache dropped (truncated, checksum, nonfinite)",
            [names.LABEL_REASON],
        )
        self.evictions = counter(names.CACHE_EVICTIONS, "Entries evicted by the store")
        self.bytes = gauge(names.CACHE_BYTES, "Bytes held by the store")
        self.entries = gauge(names.CACHE_ENTRIES, "Keys held by the store")
        self.reservations = counter(
            names.CACHE_RESERVATIONS, "Reserve outcomes per item", [names.LABEL_STATUS]
        )
        self.latency = Histogram(
            names.CACHE_LATENCY_SECONDS,
            "Service-side latency per operation",
            [names.LABEL_OP],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.store_errors = counter(
            names.CACHE_STORE_ERRORS, "Operations failed: store unavailable", [names.LABEL_STORE]
        )
        self._evictions_seen = 0
        # Plain totals for the Stats RPC (prometheus counters are not meant to be read back).
        self.totals = {"hits": 0, "misses": 0, "discards": 0, "reservations": 0}

    @contextmanager
    def timed(self, op: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.latency.labels(op).observe(time.perf_counter() - start)

    def hit(self) -> None:
        self.hits.inc()
        self.totals["hits"] += 1

    def miss(self) -> None:
        self.misses.inc()
        self.totals["misses"] += 1

    def discard(self, reason: str) -> None:
        self.discards.labels(reason).inc()
        self.totals["discards"] += 1

    def reserved(self, status: int) -> None:
        self.reservations.labels(cache_pb2.Status.Name(status).lower()).inc()
        self.totals["reservations"] += 1

    def store_error(self) -> None:
        self.store_errors.labels(self.store).inc()

    def observe_store(self, stats: StoreStats) -> None:
        self.bytes.set(stats.bytes)
        self.entries.set(stats.entries)
        if stats.evictions > self._evictions_seen:
            self.evictions.inc(stats.evictions - self._evictions_seen)
        self._evictions_seen = stats.evictions
