"""Assembles the encoder service: model runner, cache link, batcher, gRPC servicer and
health, and /metrics + /healthz over HTTP.

gRPC health (service "" and "iris.encoder.Encoder") is readiness: SERVING once the model is
loaded and the batch loop runs; NOT_SERVING while the loop is dead or one batch has run for
`batch_stall_s` (a stuck tower), and from the moment shutdown begins (iris/grpc_service.py;
iris/health.py re-checks every `health_interval_s`). /healthz is liveness: 200 while the
batch loop runs.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import TracerProvider

from encoder_svc.batcher import Batcher, BatchLimits
from encoder_svc.metrics import EncoderMetrics
from encoder_svc.preprocess import Preprocessor
from encoder_svc.proto import encoder_pb2_grpc
from encoder_svc.service import EncoderServicer
from encoder_svc.settings import EncoderSettings
from encoder_svc.sink import CacheSink, EmbeddingSink
from encoder_svc.validate import RequestLimits
from iris.grpc_service import GrpcService
from iris.mtls import TLSFiles

log = logging.getLogger(__name__)
SERVICE_NAME = "iris.encoder.Encoder"


@dataclass
class LoadedModel:
    """What the service needs from a checkpoint: its vision runner and fingerprint."""

    runner: Any
    fingerprint: bytes


def load_model(settings: EncoderSettings) -> LoadedModel:
    """The adapter's vision runner on the configured device (bfloat16 on CUDA)."""
    import torch

    from iris.models import load_adapter

    if not settings.model:
        raise ValueError("no model directory: set IRIS_ENCODER_MODEL or pass --model")
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("IRIS_ENCODER_DEVICE=cuda but no CUDA device is available")
    adapter = load_adapter(settings.model, revision=settings.model_revision)
    dtype = torch.bfloat16 if settings.device == "cuda" else torch.float32
    runner = adapter.vision_runner(device=settings.device, dtype=dtype)
    return LoadedModel(runner, adapter.fingerprint)


def batch_limits(settings: EncoderSettings) -> BatchLimits:
    return BatchLimits(
        max_images=settings.max_batch_images,
        max_tokens=settings.max_batch_vision_tokens,
        max_wait_s=settings.max_wait_ms / 1000,
        max_queue_tokens=settings.max_queue_vision_tokens,
        lease_ms=settings.lease_ms,
    )


def request_limits(settings: EncoderSettings) -> RequestLimits:
    return RequestLimits(
        max_items=settings.max_items_per_request,
        max_item_tokens=settings.max_item_vision_tokens,
        max_image_bytes=settings.max_image_bytes,
    )


class EncoderServer(GrpcService):
    """One encoder service. `start()` binds (port 0 picks a free port), `stop()` drains
    for `shutdown_grace_s`, fails what is left in the cache and ends the server.

    `model` and `sink` default to the configured checkpoint and cache service, spans go to
    the global tracer provider; tests and benchmarks may pass their own (a runner wrapped
    to count its calls, say)."""

    def __init__(
        self,
        settings: EncoderSettings,
        model: LoadedModel | None = None,
        sink: EmbeddingSink | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        super().__init__(SERVICE_NAME, settings, settings.batch_stall_s)
        self._tracer = trace.get_tracer("encoder_svc", tracer_provider=tracer_provider)
        self._model = model
        self._sink = sink
        self._cache_client = None
        self.metrics = EncoderMetrics()
        self.batcher: Batcher | None = None

    @property
    def fingerprint(self) -> bytes:
        assert self._model is not None, "start() first"
        return self._model.fingerprint

    async def start(self) -> None:
        settings = self.settings
        if self._model is None:
            self._model = await asyncio.to_thread(load_model, settings)
        if self._sink is None:
            self._cache_client = _cache_client(
                settings.cache_address, self._model.fingerprint, settings.tls()
            )
            self._sink = CacheSink(self._cache_client, _storage_dtype(settings))
        preprocessor = Preprocessor(
            self._model.runner, settings.decode_policy(), settings.preprocess_workers
        )
        self.batcher = Batcher(
            self._model.runner,
            preprocessor,
            self._sink,
            batch_limits(settings),
            self.metrics,
            self._tracer,
        )
        self.batcher.start()
        self.work_loop = self.batcher
        servicer = EncoderServicer(
            self.batcher, self._model.fingerprint, request_limits(settings), self._tracer
        )
        await self._listen(
            encoder_pb2_grpc.add_EncoderServicer_to_server,
            servicer,
            [
                ("grpc.max_receive_message_length", settings.max_message_bytes),
                ("grpc.max_send_message_length", 4 << 20),
            ],
            self.metrics.registry,
            settings.max_concurrent_rpcs,
        )
        log.info("encoder serving on %s, metrics on %d", self.address, self.metrics_port)

    async def _drain(self, grace_s: float) -> None:
        """Let admitted work finish for `grace_s`, fail leftovers in the cache, end the gRPC
        server and the cache link."""
        if self.batcher is not None:
            await self.batcher.stop(grace_s)
        if self._server is not None:
            await self._server.stop(0.5)
        if self._cache_client is not None:
            await self._cache_client.close()


def _storage_dtype(settings: EncoderSettings):
    """The torch dtype embeddings are stored in (None: the tower's own)."""
    if settings.embedding_dtype == "auto":
        return None
    import torch

    return getattr(torch, settings.embedding_dtype)


def _cache_client(address: str, fingerprint: bytes, tls: TLSFiles):
    from embedding_cache_svc.client import AsyncCacheClient

    return AsyncCacheClient(address, fingerprint, tls=tls)


async def serve(settings: EncoderSettings) -> None:
    """Run an encoder until cancelled (SIGINT / SIGTERM end it through asyncio.run)."""
    from iris.service_main import serve_with_tracing

    await serve_with_tracing("iris-encoder", settings, EncoderServer(settings))
