"""`iris llm`: run an LLM pod (heavy imports happen inside the command)."""

from __future__ import annotations

import typer

from iris.cli_options import CacheAddress, Host, MetricsPort, Model, Port


def command(
    model: Model = None,
    host: Host = None,
    port: Port = None,
    metrics_port: MetricsPort = None,
    device: str = typer.Option(None, help="auto | cpu | cuda (env IRIS_LLM_DEVICE)"),
    page_size: int = typer.Option(None, help="KV page size in tokens (env IRIS_LLM_PAGE_SIZE)"),
    cache_address: CacheAddress = None,
    pod_name: str = typer.Option(None, help="name GetModelInfo reports (env IRIS_LLM_POD_NAME)"),
) -> None:
    """Run an LLM pod: streaming generation over gRPC, KV events, /metrics."""
    options = dict(locals())  # each flag overrides the setting of its name
    from iris.service_main import run_service
    from llm_svc.settings import LLMSettings

    run_service(LLMSettings, "llm_svc.server:serve", options, require_model=True)
