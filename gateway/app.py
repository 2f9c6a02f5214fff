"""The gateway's FastAPI application: create_app(settings) → an ASGI app.

The Gateway (intake, router, pod registry, clients) is built once here and started and
stopped by the app's lifespan; routes reach it through gateway/api/deps.py.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway.api import chat, completions, health, models
from gateway.api.errors import install_error_handlers
from gateway.auth import Authenticate
from gateway.middleware import BodyCaps, BodyLimit, RequestLimit, RequestMetrics
from gateway.service import Gateway
from gateway.settings import GatewaySettings


def create_app(settings: GatewaySettings, gateway: Gateway | None = None) -> FastAPI:
    """The app for these settings (pass `gateway` to reuse an already-built one)."""
    gateway = gateway or Gateway(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(
        title="Iris gateway",
        summary="OpenAI-compatible API for vision-language models",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    install_error_handlers(app)
    for module in (chat, completions, models, health):
        app.include_router(module.router)
    # Outermost last: metrics see every answer; the key is checked before any body is read.
    caps = {
        path: BodyCaps(max_bytes, settings.max_body_values, settings.max_body_objects)
        for path, max_bytes in (
            ("/v1/chat/completions", settings.max_body_bytes),
            ("/v1/completions", settings.max_completions_body_bytes),
        )
    }
    app.add_middleware(
        BodyLimit,
        caps=caps,
        timeout_s=settings.body_timeout_s,
        # Bodies the parse pool takes are kept in shared memory as they arrive.
        spill_over_bytes=settings.parse_in_process_max_bytes if settings.parse_workers else None,
    )
    app.add_middleware(Authenticate, keys=gateway.keys, limits=gateway.key_limits)
    app.add_middleware(
        RequestLimit, limit=settings.max_requests_in_progress, retry_after_s=settings.retry_after_s
    )
    app.add_middleware(RequestMetrics)
    return app
