"""`iris operator`: run the autoscaling operator (kopf, standalone, one namespace)."""

from __future__ import annotations

from typing import Annotated

import typer


def command(
    namespace: Annotated[
        str | None, typer.Option(help="Namespace to watch (env IRIS_OPERATOR_NAMESPACE).")
    ] = None,
    interval_s: Annotated[
        float | None, typer.Option(help="Seconds between reconciles of one autoscaler.")
    ] = None,
    api_server: Annotated[
        str | None, typer.Option(help="API server URL without credentials (kubectl proxy).")
    ] = None,
) -> None:
    """Run the Iris operator: scale encoder and LLM Deployments by their pods' load."""
    from operators.run import run_operator
    from operators.settings import OperatorSettings

    settings = OperatorSettings.load(
        namespace=namespace, interval_s=interval_s, api_server=api_server
    )
    run_operator(settings)
