"""`iris llm`: run an LLM pod (heavy imports happen inside the command)."""

from __future__ import annotations

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
    from iris.service_main import load_settings, run_until_signalled
    from llm_svc.settings import LLMSettings

    settings = load_settings(
        LLMSettings,
        require_model=True,
        model=model,
        host=host,
        port=port,
        metrics_port=metrics_port,
        device=device,
        page_size=page_size,
        cache_address=cache_address,
        pod_name=pod_name,
    )
    from llm_svc.server import serve

    run_until_signalled(lambda: serve(settings))
