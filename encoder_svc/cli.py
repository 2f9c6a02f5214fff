"""`iris encoder`: run the encoder service (heavy imports happen inside)."""

from __future__ import annotations

import typer


def command(
    model: str = typer.Option(None, help="local HF model directory (env IRIS_ENCODER_MODEL)"),
    host: str = typer.Option(None, help="bind address (env IRIS_ENCODER_HOST)"),
    port: int = typer.Option(None, help="gRPC port (env IRIS_ENCODER_PORT)"),
    metrics_port: int = typer.Option(
        None, help="HTTP /metrics port (env IRIS_ENCODER_METRICS_PORT)"
    ),
    cache_address: str = typer.Option(
        None, help="cache service host:port (env IRIS_ENCODER_CACHE_ADDRESS)"
    ),
    device: str = typer.Option(None, help="cpu | cuda (env IRIS_ENCODER_DEVICE)"),
) -> None:
    """Run the encoder service (gRPC): batched, deduplicated vision encoding."""
    from encoder_svc.server import serve
    from encoder_svc.settings import EncoderSettings
    from iris.service_main import load_settings, run_until_signalled

    settings = load_settings(
        EncoderSettings,
        require_model=True,
        model=model,
        host=host,
        port=port,
        metrics_port=metrics_port,
        cache_address=cache_address,
        device=device,
    )

    run_until_signalled(lambda: serve(settings))
