"""Helpers of the cache tests: real grpc.aio servers on loopback, each on its own event
loop thread, so blocking and asyncio clients can both talk to them from a test."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid

from embedding_cache_svc.server import CacheServer
from embedding_cache_svc.settings import CacheSettings

FINGERPRINT = bytes(range(32))


class ServerThread:
    """A CacheServer running on a private event loop in a daemon thread."""

    def __init__(self, settings: CacheSettings) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = self.call(self._make(settings))
        self.address = self.server.address

    @staticmethod
    async def _make(settings: CacheSettings) -> CacheServer:
        server = CacheServer(settings)
        await server.start()
        return server

    def call(self, coro, timeout_s: float = 30.0):
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    @property
    def store(self):
        return self.server.store

    def close(self) -> None:
        try:
            self.call(self.server.stop(0.2), timeout_s=30)
        except TimeoutError:
            for task in asyncio.all_tasks(self.loop):
                task.print_stack()
            raise
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


def make_settings(store: str, redis_url: str | None = None, **overrides) -> CacheSettings:
    """Settings for a test server: ephemeral ports, a private Redis key prefix. For store
    redis-cluster, `redis_url` is the comma-separated seed list."""
    values = {"port": 0, "metrics_port": 0, "store": store, "health_interval_s": 0.1}
    if redis_url:
        where = "redis_cluster_nodes" if store == "redis-cluster" else "redis_url"
        values |= {where: redis_url, "redis_key_prefix": f"t{uuid.uuid4().hex[:8]}:"}
    values |= overrides
    # Keep the developer's IRIS_CACHE_* environment out of the tests.
    saved = {key: os.environ.pop(key) for key in list(os.environ) if key.startswith("IRIS_CACHE_")}
    try:
        return CacheSettings.load(**values)
    finally:
        os.environ.update(saved)


def redis_target(settings: CacheSettings) -> str:
    """What `make_settings` takes to reach the same Redis: the URL or the seed list."""
    if settings.store == "redis-cluster":
        return ",".join(settings.redis_cluster_nodes)
    return settings.redis_url


def raw_redis(settings: CacheSettings):
    """A blocking redis-py client of the service's Redis (one node or the cluster)."""
    import redis
    from redis.cluster import ClusterNode, RedisCluster

    if settings.store == "redis-cluster":
        seeds = [address.rpartition(":") for address in settings.redis_cluster_nodes]
        return RedisCluster(startup_nodes=[ClusterNode(h, int(p)) for h, _, p in seeds])
    return redis.Redis.from_url(settings.redis_url)


def entry_name(settings: CacheSettings, key: bytes) -> bytes:
    """The Redis key of an entry (the layout in docs/design/cache.md)."""
    return settings.redis_key_prefix.encode() + b"e:{" + key.hex().encode() + b"}"


def failure_name(settings: CacheSettings, key: bytes, token_count: int) -> bytes:
    """The Redis key of a failure recorded for (key, token_count)."""
    name = settings.redis_key_prefix.encode() + b"f:{" + key.hex().encode() + b"}:"
    return name + str(token_count).encode()


def new_key(size: int = 32) -> bytes:
    return os.urandom(size)
