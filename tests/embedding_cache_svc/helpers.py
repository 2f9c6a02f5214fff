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
    """Settings for a test server: ephemeral ports, a private Redis key prefix."""
    values = {"port": 0, "metrics_port": 0, "store": store, "health_interval_s": 0.1}
    if redis_url:
        values |= {"redis_url": redis_url, "redis_key_prefix": f"t{uuid.uuid4().hex[:8]}:"}
    values |= overrides
    # Keep the developer's IRIS_CACHE_* environment out of the tests.
    saved = {key: os.environ.pop(key) for key in list(os.environ) if key.startswith("IRIS_CACHE_")}
    try:
        return CacheSettings.load(**values)
    finally:
        os.environ.update(saved)


def new_key(size: int = 32) -> bytes:
    return os.urandom(size)
