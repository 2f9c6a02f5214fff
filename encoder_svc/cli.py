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
    import asyncio
    import contextlib
    import logging
    import signal

    from encoder_svc.server import serve
    from encoder_svc.settings import EncoderSettings
    from iris.settings import SettingsError

    try:
        settings = EncoderSettings.load(
            model=model,
            host=host,
            port=port,
            metrics_port=metrics_port,
            cache_address=cache_address,
            device=device,
        )
    except SettingsError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    if not settings.model:
        typer.echo("no model directory: pass --model or set IRIS_ENCODER_MODEL", err=True)
        raise typer.Exit(2)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(settings)

    asyncio.run(main())
