"""`iris encoder`: run the encoder service (heavy imports happen inside)."""

from __future__ import annotations

import typer

from iris.cli_options import CacheAddress, Host, MetricsPort, Model, Port


def command(
    model: Model = None,
    host: Host = None,
    port: Port = None,
    metrics_port: MetricsPort = None,
    cache_address: CacheAddress = None,
    device: str = typer.Option(None, help="cpu | cuda (env IRIS_ENCODER_DEVICE)"),
) -> None:
    """Run the encoder service (gRPC): batched, deduplicated vision encoding."""
    options = dict(locals())  # each flag overrides the setting of its name
    from encoder_svc.settings import EncoderSettings
    from iris.service_main import run_service

    run_service(EncoderSettings, "encoder_svc.server:serve", options, require_model=True)
