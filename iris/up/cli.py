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
    return root / "models" / "demo"


def command(
    model: Annotated[
        Path | None, typer.Option(help="Local HF model directory (default: the demo model)")
    ] = None,
    llm_pods: Annotated[int, typer.Option(min=1, help="LLM pod processes")] = 1,
    encoders: Annotated[int, typer.Option(min=1, help="Encoder processes")] = 1,
    cache: Annotated[str, typer.Option(help="Embedding store: memory | redis")] = "memory",
    router: Annotated[str, typer.Option(help="Routing: prefix | round-robin")] = "prefix",
    embedding_reuse: Annotated[
        str, typer.Option(help="on: share image embeddings; off: encode every image afresh")
    ] = "on",
    log_dir: Annotated[Path | None, typer.Option(help="Where service logs go")] = None,
    demo_request: Annotated[
        bool, typer.Option(help="Send one chat request with an image once up")
    ] = False,
    exit_after_demo: Annotated[
        bool, typer.Option(help="Shut down after the demo request (scripts, CI)")
    ] = False,
) -> None:
    """Start cache, encoder(s), LLM pod(s) and gateway as processes on loopback."""
    from iris.up.demo import examples, send_demo_requests, served_model
    from iris.up.platform import Platform, UpConfig

    if embedding_reuse not in ("on", "off"):
        raise typer.BadParameter(f"--embedding-reuse must be on or off, got {embedding_reuse!r}")
    on_demo_model = model is None
    if model is None:
        from iris.models import make_demo

        model = default_demo_dir()
        typer.echo(f"using the demo model at {model} (built once from installed packages)")
        make_demo(model)
    try:
        config = UpConfig(
            model_dir=model,
            llm_pods=llm_pods,
            encoders=encoders,
            cache=cache,
            router=router,
            embedding_reuse=embedding_reuse == "on",
            log_dir=log_dir,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    platform = Platform(config)
    try:
        platform.start()
        url = platform.gateway_url
        typer.echo(f"Iris is up: {url}")
        typer.echo(f"logs: {platform.log_dir}")
        typer.echo(examples(url, served_model(url)))
        if demo_request:
            for (question, reply), has_image in zip(
                send_demo_requests(url), (True, False), strict=True
            ):
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
        if not exit_after_demo:
            typer.echo("Ctrl-C to stop.")
            stop.wait()
    finally:
        typer.echo("stopping...")
        platform.stop()
