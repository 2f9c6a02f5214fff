"""Assembles an LLM pod: engine thread, gRPC servicer and health, /metrics + /healthz.

gRPC health (service "" and "iris.llm.LLM") is readiness: SERVING once the model is loaded
and the engine thread runs; NOT_SERVING while the engine thread is dead, probes after a
failed step, or has completed no step for `step_stall_s` while work waits, and from the
moment shutdown begins (iris/health.py
re-checks every `health_interval_s`). /healthz answers 200 while the engine thread is alive
(liveness).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from opentelemetry import trace
from opentelemetry.trace import TracerProvider

from iris.grpc_service import GrpcService
from iris.multimodal import LayerKind, PrefixResumeRule
from llm_svc.engine import LLMEngine
from llm_svc.proto import llm_pb2, llm_pb2_grpc
from llm_svc.server.builder import build_engine
from llm_svc.server.kv_events import KVEventLog
from llm_svc.server.metrics import LLMMetrics
from llm_svc.server.service import KVNotifier, LLMServicer, ServingLimits
from llm_svc.server.step_failures import step_fault_from_env, test_hooks_enabled
from llm_svc.server.streams import StreamRegistry
from llm_svc.server.worker import FAULT_PUBLISH_WAIT_S, EngineWorker
from llm_svc.settings import LLMSettings

log = logging.getLogger(__name__)
SERVICE_NAME = "iris.llm.LLM"
# The pod's exit status when its engine cannot go on (repeated step failures, a device
# error): non-zero, so Kubernetes or `iris up`'s supervisor starts a fresh one.
ENGINE_FAILED_EXIT_CODE = 3


_LAYER_KINDS = {
    LayerKind.FULL: llm_pb2.AttentionLayer.FULL,
    LayerKind.SLIDING: llm_pb2.AttentionLayer.SLIDING,
    LayerKind.LINEAR: llm_pb2.AttentionLayer.LINEAR,
}


def reported_layers(rule: PrefixResumeRule) -> list[llm_pb2.AttentionLayer]:
    """The layers of the pod's resumable-prefix rule, as GetModelInfo reports them."""
    return [
        llm_pb2.AttentionLayer(
            kind=_LAYER_KINDS[layer.kind],
            window=layer.window,
            snapshot_interval=layer.snapshot_interval,
        )
        for layer in rule.layers
    ]


def model_info(engine: LLMEngine, settings: LLMSettings) -> llm_pb2.ModelInfo:
    """What GetModelInfo answers (the gateway checks the fingerprint and page size, and
    builds the same resumable-prefix rule from the page size and the layers)."""
    template = getattr(engine.tokenizer, "chat_template", None)
    return llm_pb2.ModelInfo(
        model_id=settings.model_id or Path(engine.config.model_dir).name,
        fingerprint=engine.fingerprint,
        page_size=engine.config.page_size,
        vocab_size=engine.model_config.vocab_size,
        max_model_len=engine.config.max_model_len,
        chat_template=template if isinstance(template, str) else "",
        pod_name=settings.pod_name,
        layers=reported_layers(engine.resume_rule),
    )


class LLMServer(GrpcService):
    """One LLM pod. `start()` loads the model (unless an engine is given) and binds (port 0
    picks a free port); `stop()` lets streams finish for the grace period, then aborts.

    `engine` and `tracer_provider` default to the configured checkpoint and the global
    provider; tests pass their own."""

    def __init__(
        self,
        settings: LLMSettings,
        engine: LLMEngine | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        super().__init__(SERVICE_NAME, settings, settings.step_stall_s)
        self.engine = engine
        self.metrics = LLMMetrics()
        self.streams = StreamRegistry()
        self._tracer = trace.get_tracer("llm_svc.server", tracer_provider=tracer_provider)
        self.kv_log: KVEventLog | None = None
        self.worker: EngineWorker | None = None
        self.servicer: LLMServicer | None = None
        self.exit_code = 0  # ENGINE_FAILED_EXIT_CODE once the engine thread has died

    async def start(self) -> None:
        settings = self.settings
        if self.engine is None:
            self.engine = await asyncio.to_thread(build_engine, settings)
        engine = self.engine
        loop = asyncio.get_running_loop()
        notifier = KVNotifier()
        self.kv_log = KVEventLog(
            settings.kv_event_buffer, lambda: loop.call_soon_threadsafe(notifier.published)
        )
        if engine.step_fault is None:
            engine.step_fault = step_fault_from_env()
        self.metrics.watch_grammars(engine.grammars)
        self.metrics.watch_store(getattr(engine, "kv_store", None))
        self.worker = EngineWorker(
            engine,
            lambda events: loop.call_soon_threadsafe(self.streams.dispatch, events),
            self.kv_log,
            self.metrics,
            max_failures=settings.max_consecutive_step_failures,
            on_fault=lambda _: self._publish_readiness(loop),
            on_fatal=lambda reason: loop.call_soon_threadsafe(self._engine_died, reason),
        )
        limits = ServingLimits(
            fingerprint=engine.fingerprint,
            max_model_len=engine.config.max_model_len,
            max_waiting=settings.max_waiting,
            retry_after_ms=settings.retry_after_ms,
        )
        self.servicer = LLMServicer(
            self.worker,
            self.streams,
            self.kv_log,
            notifier,
            model_info(engine, settings),
            limits,
            engine.tokenizer,
            self._tracer,
            test_hooks=test_hooks_enabled(),
        )
        self.worker.start()
        self.work_loop = self.worker
        await self._listen(
            llm_pb2_grpc.add_LLMServicer_to_server,
            self.servicer,
            [("grpc.max_receive_message_length", settings.max_message_bytes)],
            self.metrics.registry,
        )
        log.info(
            "llm pod %s serving %s on %s, metrics on %d",
            settings.pod_name,
            engine.config.model_dir,
            self.address,
            self.metrics_port,
        )

    def _publish_readiness(self, loop: asyncio.AbstractEventLoop) -> None:
        """From the engine thread: publish readiness now (NOT_SERVING while the engine
        probes), returning once it is published, so no new work is routed here first."""
        future = asyncio.run_coroutine_threadsafe(self.readiness.refresh(), loop)
        future.result(timeout=FAULT_PUBLISH_WAIT_S)

    def _engine_died(self, reason: str) -> None:
        """The engine thread ended for good: stop serving, so that `serve` exits non-zero."""
        log.critical("llm pod %s exits: %s", self.settings.pod_name, reason)
        self.exit_code = ENGINE_FAILED_EXIT_CODE
        asyncio.ensure_future(self.readiness.refresh())
        if self._server is not None:
            asyncio.ensure_future(self._server.stop(self.settings.shutdown_grace_s))

    async def _drain(self, grace_s: float) -> None:
        """Let open streams run for `grace_s`, then abort the rest and end the engine."""
        if self._server is not None:
            await self._server.stop(grace_s)
        if self.worker is not None:
            await asyncio.to_thread(self.worker.stop)

    def _health_body(self) -> dict:
        return {**super()._health_body(), "pod": self.settings.pod_name}


async def serve(settings: LLMSettings) -> None:
    """Run an LLM pod until cancelled (SIGINT / SIGTERM end it through asyncio.run)."""
    from iris.service_main import serve_with_tracing

    server = LLMServer(settings)
    await serve_with_tracing("iris-llm", settings, server)
    if server.exit_code:
        raise SystemExit(server.exit_code)
