"""`iris gateway`: serve the OpenAI-compatible API (settings from IRIS_GATEWAY_* and flags)."""

from __future__ import annotations

from typing import Annotated

import typer


def command(
    model: Annotated[str | None, typer.Option(help="local model directory")] = None,
    host: Annotated[str | None, typer.Option(help="bind address")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default 8000)")] = None,
    llm: Annotated[
        list[str] | None, typer.Option("--llm", help="LLM pod host:port (repeatable)")
    ] = None,
    encoder: Annotated[
        list[str] | None, typer.Option("--encoder", help="encoder host:port (repeatable)")
    ] = None,
    cache: Annotated[str | None, typer.Option("--cache", help="cache host:port")] = None,
    router_config: Annotated[
        str | None, typer.Option(help="routing policy name or YAML file")
    ] = None,
) -> None:
    """Run the gateway: OpenAI REST in, images hashed, prompts routed to LLM pods."""
    import logging

    from gateway.serving import serve
    from gateway.settings import GatewaySettings
    from iris.settings import SettingsError
    from iris.telemetry import setup_tracing, shutdown_tracing

    try:
        settings = GatewaySettings.load(
            model=model,
            host=host,
            port=port,
            llm_addresses=llm or None,
            encoder_addresses=encoder or None,
            cache_address=cache,
            router_config=router_config,
        )
    except SettingsError as err:
        raise typer.BadParameter(str(err)) from None
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    setup_tracing("iris-gateway", settings.otlp_endpoint)
    try:
        serve(settings)
    finally:
        shutdown_tracing()
