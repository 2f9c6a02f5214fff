"""Start the operator process: logging, tracing, /metrics, then kopf until signalled."""

from __future__ import annotations

import asyncio
import logging

import kopf
from prometheus_client import start_http_server

from iris.telemetry import setup_tracing
from operators.handlers import register
from operators.settings import OperatorSettings


async def serve(settings: OperatorSettings, stop_flag: asyncio.Event | None = None) -> None:
    """Run kopf in this event loop (standalone: one replica, no peering) until stopped."""
    registry = kopf.OperatorRegistry()
    memo = register(registry, settings)
    await kopf.operator(
        registry=registry,
        memo=memo,
        namespaces=[settings.namespace],
        standalone=True,
        stop_flag=stop_flag,
    )


def run_operator(settings: OperatorSettings) -> None:
    """Blocking entry point of `iris operator`."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(message)s")
    setup_tracing("iris-operator", settings.otlp_endpoint)
    if settings.metrics_port:
        start_http_server(settings.metrics_port, addr=settings.host)
    asyncio.run(serve(settings))
