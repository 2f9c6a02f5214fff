"""What every gRPC service's entry point does: load its Settings (exit 2 naming the bad
key), set up logging, run its async server until SIGINT / SIGTERM, with tracing on."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import typer

from iris.settings import ServiceSettings, SettingsError

S = TypeVar("S", bound=ServiceSettings)

# A service never uses gRPC in a forked child, but libraries it loads do fork (and exec) now
# and then; with gRPC's fork support on, such a fork can break the parent's poller ("epoll_wait
# error: Bad file descriptor", then abort). Read by gRPC when it starts: set before that.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


class Server(Protocol):
    async def start(self) -> None: ...
    async def wait(self) -> None: ...
    async def stop(self) -> None: ...


def load_settings(settings_class: type[S], require_model: bool = False, **overrides: Any) -> S:
    """Settings from the environment plus CLI overrides; a bad value exits 2 with its key."""
    try:
        settings = settings_class.load(**overrides)
    except SettingsError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    if require_model and not getattr(settings, "model", None):
        prefix = settings_class.model_config.get("env_prefix", "")
        typer.echo(f"no model directory: pass --model or set {prefix}MODEL", err=True)
        raise typer.Exit(2)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return settings


def run_until_signalled(serve: Callable[[], Awaitable[None]]) -> None:
    """asyncio.run(serve()) where SIGINT / SIGTERM cancel it (a clean exit 0)."""

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve()

    asyncio.run(main())


def run_service(
    settings_class: type[S], serve: str, options: dict[str, Any], require_model: bool = False
) -> None:
    """A service command's body: settings from the environment and the flags (`options`),
    then `serve(settings)` ("module:function", imported only once the settings are good)
    until SIGINT / SIGTERM."""
    settings = load_settings(settings_class, require_model, **options)
    module, function = serve.split(":")
    serve_fn = getattr(importlib.import_module(module), function)
    run_until_signalled(lambda: serve_fn(settings))


async def serve_with_tracing(service_name: str, settings: ServiceSettings, server: Server) -> None:
    """Start `server`, freeze its startup heap (iris/heap.py), wait until cancelled, stop
    it and flush the spans."""
    from iris.heap import freeze_startup_heap
    from iris.telemetry import setup_tracing, shutdown_tracing

    setup_tracing(service_name, settings.otlp_endpoint)
    await server.start()
    freeze_startup_heap()
    try:
        await server.wait()
    finally:
        await server.stop()
        shutdown_tracing()
