"""`iris cache`: run the embedding cache service (heavy imports happen inside)."""

from __future__ import annotations

import typer


def command(
    store: str = typer.Option(None, help="memory | redis (env IRIS_CACHE_STORE)"),
    host: str = typer.Option(None, help="bind address (env IRIS_CACHE_HOST)"),
    port: int = typer.Option(None, help="gRPC port (env IRIS_CACHE_PORT)"),
    metrics_port: int = typer.Option(None, help="HTTP /metrics port (env IRIS_CACHE_METRICS_PORT)"),
    redis_url: str = typer.Option(None, help="redis://host:port/db (env IRIS_CACHE_REDIS_URL)"),
    memory_bytes: int = typer.Option(None, help="memory store bytes (IRIS_CACHE_MEMORY_BYTES)"),
) -> None:
    """Run the embedding cache service (gRPC; memory or Redis store)."""
    from embedding_cache_svc.server import serve
    from embedding_cache_svc.settings import CacheSettings
    from iris.service_main import load_settings, run_until_signalled

    settings = load_settings(
        CacheSettings,
        store=store,
        host=host,
        port=port,
        metrics_port=metrics_port,
        redis_url=redis_url,
        memory_bytes=memory_bytes,
    )

    run_until_signalled(lambda: serve(settings))
