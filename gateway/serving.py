"""Run the gateway app under uvicorn, and end the streams still open when it stops.

On SIGTERM / SIGINT uvicorn stops accepting, lets requests finish for `shutdown_grace_s`
(settings), then cancels what is left, which would cut a stream off mid-chunk. A second
before that, each open stream ends itself with a 503 `shutting_down` error event and [DONE]
instead (gateway/api/streaming.py), and its generations are cancelled on the pods.
"""

from __future__ import annotations

import sys

import uvicorn
from prometheus_client import REGISTRY

from gateway.app import create_app
from gateway.http_protocol import HeadLimits, door_protocol
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from iris.heap import freeze_startup_heap
from iris.metrics_http import MetricsHTTPServer


class DrainingServer(uvicorn.Server):
    """uvicorn's server, telling the gateway when its shutdown begins."""

    def __init__(self, config: uvicorn.Config, gateway: Gateway, grace_s: float) -> None:
        super().__init__(config)
        self.gateway = gateway
        self.grace_s = grace_s

    async def shutdown(self, sockets=None) -> None:
        self.gateway.begin_drain(streams_end_after_s=self.grace_s - 1)
        await super().shutdown(sockets)


def serve(settings: GatewaySettings) -> None:
    """Serve until SIGTERM / SIGINT; /metrics (and /healthz) on `settings.metrics_port`,
    from a thread of its own, as every Iris service."""
    # Worker threads (template, tokenizer, schema checks, image headers) hand the GIL back
    # every millisecond rather than every 5: the event loop waits at most that long for it.
    sys.setswitchinterval(0.001)
    gateway = Gateway(settings)
    gateway.bodies.start()  # the parse processes, spawned before the first large body
    limits = HeadLimits()
    config = uvicorn.Config(
        create_app(settings, gateway),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=settings.shutdown_grace_s,
        # Connections and requests are bounded by the door itself, answering in JSON
        # (gateway/http_protocol.py, gateway/middleware.py), not by uvicorn's plain text.
        http=door_protocol(
            settings.header_timeout_s, settings.max_connections, settings.retry_after_s, limits
        ),
        h11_max_incomplete_event_size=limits.h11_buffer_bytes,
    )
    metrics_http = MetricsHTTPServer(
        REGISTRY, lambda: {"ok": True}, settings.host, settings.metrics_port, "gateway-metrics"
    )
    metrics_http.start()
    freeze_startup_heap()  # the adapter and tokenizer are loaded: iris/heap.py
    try:
        DrainingServer(config, gateway, settings.shutdown_grace_s).run()
    finally:
        metrics_http.stop()
