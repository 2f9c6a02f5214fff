"""`iris up`: run the whole platform locally until Ctrl-C / SIGTERM."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer


def default_demo_dir() -> Path:
    root = Path(os.environ.get("IRIS_HOME", "~/.cache/iris")).expanduser()
    # Named for the architecture: a demo built by an older Iris (a toy tower) is not reused.
    return root / "models" / "demo-smolvlm-256m"


def command(
    model: Annotated[
        Path | None, typer.Option(help="Local HF model directory (default: the demo model)")
    ] = None,
    llm_pods: Annotated[int, typer.Option(min=1, help="LLM pod processes")] = 1,
    tensor_parallel_size: Annotated[
        int, typer.Option(min=1, help="Tensor-parallel ranks (processes) per LLM pod")
    ] = 1,
    encoders: Annotated[int, typer.Option(min=1, help="Encoder processes")] = 1,
    gateways: Annotated[
        int, typer.Option(min=1, help="Gateway processes, each on its own port (all printed)")
    ] = 1,
    cache: Annotated[
        str, typer.Option(help="Embedding store: memory | redis | redis-cluster")
    ] = "memory",
    kv_store: Annotated[
        str,
        typer.Option(
            help="KV store the LLM pods share: off | memory | redis | redis-cluster. redis and"
            " redis-cluster start their own redis-server(s) on loopback (maxmemory,"
            " allkeys-lru), apart from the embedding cache's; memory lives inside each pod's"
            " process and is NOT shared between pods (for trying the path on one pod)"
        ),
    ] = "off",
    host_kv_bytes: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Each LLM pod's host KV tier in bytes (IRIS_LLM_HOST_KV_BYTES; a store needs"
            " it). Default: 256 MiB with --kv-store, off without",
        ),
    ] = None,
    router: Annotated[
        str, typer.Option(help="Routing: prefix | estimated-wait | estimated-ttft | round-robin")
    ] = "prefix",
    embedding_reuse: Annotated[
        str, typer.Option(help="on: share image embeddings; off: encode every image afresh")
    ] = "on",
    api_key: Annotated[
        list[str] | None,
        typer.Option(
            "--api-key",
            help="Require this API key (Authorization: Bearer); repeatable; each key then gets"
            " its own cache (per-key tenancy). Default: open",
        ),
    ] = None,
    log_dir: Annotated[Path | None, typer.Option(help="Where service logs go")] = None,
    demo_request: Annotated[
        bool, typer.Option(help="Send one chat request with an image once up")
    ] = False,
    exit_after_demo: Annotated[
        bool, typer.Option(help="Shut down after the demo request (scripts, CI)")
    ] = False,
    prometheus: Annotated[
        bool,
        typer.Option(
            help="Also run Prometheus (from PATH or .tools/) scraping every service, with the "
            "chart's recording and alert rules; prints its URL"
        ),
    ] = False,
) -> None:
    """Start cache, encoder(s), LLM pod(s) and gateway as processes on loopback."""
    from iris.up.demo import examples, served_model
    from iris.up.platform import Platform, StartInterrupted, StartupError, UpConfig

    if embedding_reuse not in ("on", "off"):
        raise typer.BadParameter(f"--embedding-reuse must be on or off, got {embedding_reuse!r}")
    on_demo_model = model is None
    try:  # every flag is checked before the demo model is built (which takes a while)
        config = UpConfig(
            model_dir=model or default_demo_dir(),
            llm_pods=llm_pods,
            tensor_parallel_size=tensor_parallel_size,
            encoders=encoders,
            gateways=gateways,
            cache=cache,
            kv_store=kv_store,
            host_kv_bytes=host_kv_bytes,
            router=router,
            embedding_reuse=embedding_reuse == "on",
            api_keys=tuple(api_key or ()),
            log_dir=log_dir,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if on_demo_model:
        from iris.models import make_demo

        typer.echo(
            f"using the demo model at {config.model_dir} (built once from installed packages)"
        )
        make_demo(config.model_dir)
    try:
        platform = Platform(config)
    except OSError as err:
        raise typer.BadParameter(f"--log-dir {log_dir}: {err}") from None
    typer.echo(f"logs: {platform.log_dir}")

    # SIGINT and SIGTERM only set this flag: until everything is up it interrupts the start
    # where it is (the start polls it), afterwards it stops the platform. A flag, not an
    # exception raised into whatever the main thread is doing at that instant.
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stoppers: list = []  # what runs beside the platform (Prometheus), stopped before it
    try:
        try:
            platform.start(stop)
        except StartupError as err:
            typer.echo(f"iris up: the platform did not start: {err}", err=True)
            raise typer.Exit(1) from None
        except StartInterrupted:
            typer.echo("interrupted while starting", err=True)
            raise typer.Exit(130) from None
        url = platform.gateway_url
        key = config.api_keys[0] if config.api_keys else None
        typer.echo(f"Iris is up: {url}" + (" (API key required)" if key else ""))
        for other in platform.gateway_urls[1:]:
            typer.echo(f"  another gateway: {other}")
        if prometheus:
            from iris.up.prometheus import start_beside_platform

            stoppers.append(start_beside_platform(platform, typer.echo))
        typer.echo(examples(url, served_model(url, key), keyed=key is not None))
        if demo_request:
            _demo(url, on_demo_model, key)
        if not exit_after_demo:
            typer.echo("Ctrl-C to stop.")
            _supervise(platform, stop)
    finally:
        typer.echo("stopping...")
        for stop_one in stoppers:
            stop_one()
        platform.stop()


def _demo(url: str, on_demo_model: bool, api_key: str | None) -> None:
    """Send the demo requests and print their answers; a refused one ends `iris up` (1)."""
    import httpx

    from iris.up.demo import send_demo_requests

    try:
        replies = send_demo_requests(url, api_key=api_key)
    except httpx.HTTPStatusError as err:
        typer.echo(f"iris up: the demo request failed: {err.response.text}", err=True)
        raise typer.Exit(1) from None
    for (question, reply), has_image in zip(replies, (True, False), strict=True):
        typer.echo(f"demo request: {question}")
        choice = reply["choices"][0]
        answer = choice["message"]["content"].strip() or "(empty)"
        typer.echo(f"  answer: {answer}  [finish_reason: {choice['finish_reason']}]")
        typer.echo(f"  usage: {reply['usage']}")
        if has_image and on_demo_model:
            typer.echo(
                "  (the demo model's vision tower is random, so what it says about an "
                "image, often nothing, means nothing: this request shows the image "
                "path gateway -> encoder -> cache -> LLM pod works)"
            )


def _supervise(platform, stop: threading.Event) -> None:
    """Serve until `stop`, restarting services that exit (iris/up/supervisor.py). A service
    in a crash loop is given up and the platform serves on without it; without its gateway
    nothing can be served, so once every gateway is given up `iris up` ends (1)."""
    from iris.up.supervisor import Supervisor

    def report(message: str) -> None:
        for line in message.splitlines():
            typer.echo(f"iris up: {line}", err=True)

    supervisor = Supervisor(
        platform.services, lambda service: platform.is_healthy(service, 0.5), report
    )
    while not stop.wait(0.2):
        supervisor.tick()
        gateways = {service.name for service in platform.services if service.kind == "gateway"}
        if gateways <= supervisor.given_up:
            raise typer.Exit(1)
