"""`iris cache`: run the embedding cache service (heavy imports happen inside)."""

from __future__ import annotations

import typer

from iris.cli_options import Host, MetricsPort, Port


def command(
    store: str = typer.Option(None, help="memory | redis (env IRIS_CACHE_STORE)"),
    host: Host = None,
    port: Port = None,
    metrics_port: MetricsPort = None,
    redis_url: str = typer.Option(None, help="redis://host:port/db (env IRIS_CACHE_REDIS_URL)"),
    memory_bytes: int = typer.Option(None, help="memory store bytes (IRIS_CACHE_MEMORY_BYTES)"),
) -> None:
    """Run the embedding cache service (gRPC; memory or Redis store)."""
    options = dict(locals())  # each flag overrides the setting of its name
    from embedding_cache_svc.settings import CacheSettings
    from iris.service_main import run_service

    run_service(CacheSettings, "embedding_cache_svc.server:serve", options)
