"""`iris llm`: run an LLM pod (heavy imports happen inside the command)."""

from __future__ import annotations

import contextlib

import typer


def command(
    model: str = typer.Option(None, help="local HF model directory (env IRIS_LLM_MODEL)"),
    host: str = typer.Option(None, help="bind address (env IRIS_LLM_HOST)"),
    port: int = typer.Option(None, help="gRPC port (env IRIS_LLM_PORT)"),
    metrics_port: int = typer.Option(None, help="HTTP /metrics port (env IRIS_LLM_METRICS_PORT)"),
    device: str = typer.Option(None, help="auto | cpu | cuda (env IRIS_LLM_DEVICE)"),
    page_size: int = typer.Option(None, help="KV page size in tokens (env IRIS_LLM_PAGE_SIZE)"),
    cache_address: str = typer.Option(
        None, help="embedding cache host:port (env IRIS_LLM_CACHE_ADDRESS)"
    ),
    pod_name: str = typer.Option(None, help="name GetModelInfo reports (env IRIS_LLM_POD_NAME)"),
) -> None:
    """Run an LLM pod: streaming generation over gRPC, KV events, /metrics."""
    import asyncio
    import logging
    import signal

    from iris.settings import SettingsError
    from llm_svc.settings import LLMSettings

    try:
        settings = LLMSettings.load(
            model=model,
            host=host,
            port=port,
            metrics_port=metrics_port,
            device=device,
            page_size=page_size,
            cache_address=cache_address,
            pod_name=pod_name,
        )
    except SettingsError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    if not settings.model:
        typer.echo("no model directory: pass --model or set IRIS_LLM_MODEL", err=True)
        raise typer.Exit(2)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from llm_svc.server import serve

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(settings)

    asyncio.run(main())
