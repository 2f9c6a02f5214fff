"""Assembles the cache service: store + servicer on a grpc.aio server, gRPC health, and
/metrics + /healthz over HTTP, with a background loop that pings the store.

gRPC health (service "" and "iris.cache.EmbeddingCache") is SERVING while the store
answers and NOT_SERVING while it does not (readiness); /healthz stays 200 while the
process is up and reports the store's state in its body (liveness).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from embedding_cache_svc.metrics import CacheMetrics
from embedding_cache_svc.proto import cache_pb2_grpc
from embedding_cache_svc.service import CacheServicer
from embedding_cache_svc.settings import CacheSettings
from embedding_cache_svc.store import Store, StoreUnavailable, make_store
from iris.health import ServiceHealth
from iris.metrics_http import MetricsHTTPServer
from iris.mtls import role_interceptors
from iris.mtls.credentials import add_port

log = logging.getLogger(__name__)
SERVICE_NAME = "iris.cache.EmbeddingCache"
# Headroom above the largest data message (chunk_bytes) for the other fields.
MESSAGE_SLACK = 64 << 10
STOP_SLACK_S = 5.0


async def _bounded(step: str, awaitable, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(awaitable, timeout_s)
    except TimeoutError:
        log.warning("shutdown step %r did not finish in %.1f s; going on", step, timeout_s)


class CacheServer:
    """One cache service. `start()` binds (port 0 picks free ports), `stop()` ends it."""

    def __init__(self, settings: CacheSettings, store: Store | None = None) -> None:
        self.settings = settings
        self.store = store or make_store(settings)
        self.metrics = CacheMetrics(self.store.name)
        self.servicer = CacheServicer(self.store, settings, self.metrics)
        self.health = ServiceHealth(SERVICE_NAME)
        self.http: MetricsHTTPServer | None = None
        self.store_ok = True
        self.store_error = ""  # why the store is unavailable (readiness), "" when it is not
        self.port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._health_task: asyncio.Task | None = None

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

    async def start(self) -> None:
        limit = self.settings.chunk_bytes + MESSAGE_SLACK
        options = [
            ("grpc.max_receive_message_length", max(limit, 4 << 20)),
            ("grpc.max_send_message_length", max(limit, 4 << 20)),
            # A port already taken must fail the start, not be shared with its owner.
            ("grpc.so_reuseport", 0),
        ]
        tls = self.settings.tls()
        self._server = grpc.aio.server(options=options, interceptors=role_interceptors(tls))
        cache_pb2_grpc.add_EmbeddingCacheServicer_to_server(self.servicer, self._server)
        self.health.add_to(self._server)
        self.port = add_port(self._server, f"{self.settings.host}:{self.settings.port}", tls)
        await self._server.start()
        self.http = MetricsHTTPServer(
            self.metrics.registry, self._health_body, self.settings.host, self.settings.metrics_port
        )
        self.http.start()
        self.metrics_port = self.http.port
        await self._check_store()
        self._health_task = asyncio.create_task(self._health_loop())
        log.info(
            "cache serving on %s (store %s), metrics on %d",
            self.address,
            self.store.name,
            self.metrics_port,
        )

    async def wait(self) -> None:
        assert self._server is not None, "start() first"
        await self._server.wait_for_termination()

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving: in-flight calls get `grace_s`; no step may hang shutdown."""
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if self._server is not None:
            await _bounded("grpc server stop", self._server.stop(grace_s), grace_s + STOP_SLACK_S)
        if self.http is not None:
            await _bounded("metrics http stop", asyncio.to_thread(self.http.stop), STOP_SLACK_S)
        await _bounded("store close", self.store.close(), STOP_SLACK_S)

    def _health_body(self) -> dict:
        return {
            "ok": True,
            "store": self.store.name,
            "store_ok": self.store_ok,
            "store_error": self.store_error,
        }

    async def _check_store(self) -> None:
        try:
            await self.store.ping()
            self.metrics.observe_store(await self.store.stats())
            ok = True
        except StoreUnavailable as err:
            if self.store_ok:
                log.warning("store unavailable: %s", err)
            self.metrics.store_error()
            self.store_error = str(err)
            ok = False
        if ok and not self.store_ok:
            log.info("store available again")
        self.store_ok = ok
        if ok:
            self.store_error = ""
        await self.health.set(ok)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            try:
                await self._check_store()
            except Exception:  # the loop must outlive any one bad check
                log.exception("store health check failed")


async def serve(settings: CacheSettings) -> None:
    """Run a cache service until cancelled (SIGINT / SIGTERM end it through asyncio.run)."""
    from iris.service_main import serve_with_tracing

    await serve_with_tracing("iris-cache", settings, CacheServer(settings))
