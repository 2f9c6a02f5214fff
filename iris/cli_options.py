"""The flags the gRPC services' commands share (`iris cache|encoder|llm`). Each flag
overrides the service's setting of the same name, IRIS_<SERVICE>_<NAME> in the environment."""

from __future__ import annotations

from typing import Annotated

import typer

Model = Annotated[
    str | None, typer.Option(help="local HF model directory (env IRIS_<SERVICE>_MODEL)")
]
Host = Annotated[str | None, typer.Option(help="bind address (env IRIS_<SERVICE>_HOST)")]
Port = Annotated[int | None, typer.Option(help="gRPC port (env IRIS_<SERVICE>_PORT)")]
MetricsPort = Annotated[
    int | None, typer.Option(help="HTTP /metrics port (env IRIS_<SERVICE>_METRICS_PORT)")
]
CacheAddress = Annotated[
    str | None, typer.Option(help="embedding cache host:port (env IRIS_<SERVICE>_CACHE_ADDRESS)")
]
