"""Helpers of the LLM server tests: a real LLMServer on its own event-loop thread (so the
test's loop and the server's never share), and prompts built with the model's own rules."""

from __future__ import annotations

import asyncio
import io
import threading

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from iris.multimodal import Modality, MultimodalItem, image_identity, pad_with_offsets
from iris.proto import common_pb2
from llm_svc.proto import llm_pb2
from llm_svc.server import LLMServer
from llm_svc.server.builder import build_engine
from llm_svc.settings import LLMSettings


def pod_settings(model_dir, **overrides) -> LLMSettings:
    base = dict(
        model=str(model_dir),
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        device="cpu",
        page_size=4,
        kv_num_pages=128,
        max_num_seqs=8,
        max_batch_tokens=64,
        pod_name="pod-test",
        shutdown_grace_s=0.5,
    )
    base.update(overrides)
    return LLMSettings.load(**base)


class PodThread:
    """An LLMServer (real engine, real gRPC on loopback) on a private loop in a thread."""

    def __init__(self, settings: LLMSettings) -> None:
        self.settings = settings
        self.spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = LLMServer(settings, build_engine(settings), tracer_provider=provider)
        self.call(self.server.start())
        self.address = self.server.address

    def call(self, coro, timeout_s: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def on_engine(self, fn, timeout_s: float = 30.0):
        """Run `fn(engine)` on the engine thread, between steps."""
        return self.server.worker.call(fn).result(timeout_s)

    @property
    def engine(self):
        return self.server.engine

    def close(self) -> None:
        self.call(self.server.stop(0.5))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


def idle_engine_state(engine) -> dict:
    """What must hold once every request is gone: no request, no page held."""
    return {
        "requests": len(engine.requests),
        "running": len(engine.scheduler.running),
        "waiting": len(engine.scheduler.waiting),
        "pages_in_use": engine.blocks.num_used,
    }


IDLE = {"requests": 0, "running": 0, "waiting": 0, "pages_in_use": 0}


def sampling(max_tokens: int, **extra) -> common_pb2.SamplingParams:
    """Greedy, EOS ignored, so the length is exact."""
    return common_pb2.SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **extra
    )


def request(
    request_id: str, ids, max_tokens: int, cache_salt: bytes = b"", **extra
) -> llm_pb2.GenerateRequest:
    return llm_pb2.GenerateRequest(
        request_id=request_id,
        input_ids=list(ids),
        sampling=sampling(max_tokens, **extra),
        cache_salt=cache_salt,
    )


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    from PIL import Image

    image = Image.new("RGB", (width, height), (seed * 37 % 256, 80, 160))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def image_request(model_dir, fingerprint: bytes, request_id: str, seed: int = 0):
    """A padded prompt with one image, as the gateway builds it: (GenerateRequest, item)."""
    from iris.models import load_adapter

    adapter = load_adapter(model_dir)
    image = png_bytes(32, 32, seed)
    count, grid = adapter.image_token_count(32, 32)
    ids = adapter.encode_prompt(f"Describe {adapter.image_token} please")
    expanded, spans = adapter.expand_prompt(ids, [grid])
    item = MultimodalItem(modality=Modality.IMAGE)
    item.set_identity(image_identity(image, fingerprint))
    item.offsets = [tuple(span) for span in spans[0]]
    item.token_count = count
    item.grid = tuple(grid)
    padded = pad_with_offsets(expanded, [item])
    proto_item = common_pb2.MultimodalItem(
        modality=common_pb2.IMAGE,
        identity=item.identity,
        hash=item.hash,
        offsets=[common_pb2.Span(start=s, end=e) for s, e in item.offsets],
        token_count=item.token_count,
        grid=list(item.grid),
    )
    generate = llm_pb2.GenerateRequest(
        request_id=request_id,
        input_ids=padded.tolist(),
        items=[proto_item],
        sampling=sampling(4),
        fingerprint=fingerprint,
    )
    return generate, item


class CacheThread:
    """A real embedding cache service (memory store) on its own loop thread."""

    def __init__(self) -> None:
        from embedding_cache_svc.server import CacheServer
        from embedding_cache_svc.settings import CacheSettings

        settings = CacheSettings.load(host="127.0.0.1", port=0, metrics_port=0)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = CacheServer(settings)
        self.call(self.server.start())
        self.address = self.server.address

    def call(self, coro, timeout_s: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.call(self.server.stop(0.5))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


def dead_address() -> str:
    """host:port where nothing listens (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"
