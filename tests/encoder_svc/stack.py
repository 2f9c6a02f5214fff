"""A real encoder + real cache service on loopback, for the encoder tests and benchmark.

The runner is the adapter's real vision runner, wrapped by `CountingRunner` to count its
tower calls (and, when a test closes its gate, to hold the tower so work stays queued).
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass, field

import grpc
import numpy as np
from PIL import Image

from embedding_cache_svc.client import AsyncCacheClient
from embedding_cache_svc.server import CacheServer
from embedding_cache_svc.settings import CacheSettings
from encoder_svc.proto import encoder_pb2, encoder_pb2_grpc
from encoder_svc.server import EncoderServer, LoadedModel
from encoder_svc.settings import EncoderSettings
from iris.multimodal import image_identity, read_image_header
from iris.proto import common_pb2

GRPC_OPTIONS = [("grpc.max_send_message_length", 64 << 20)]


@dataclass
class Family:
    """A loaded tiny checkpoint: its adapter (counting rules) and vision runner."""

    name: str
    model_dir: object
    adapter: object
    runner: object

    @property
    def fingerprint(self) -> bytes:
        return self.adapter.fingerprint


def load_family(name: str, model_dir) -> Family:
    from iris.models import load_adapter

    adapter = load_adapter(model_dir)
    return Family(name, model_dir, adapter, adapter.vision_runner())


class CountingRunner:
    """The real runner with its `encode` counted: `calls` holds the batch size of each
    tower call. While `gate` is clear, `encode` waits (so tests can keep work queued);
    `entered` is set once a call has reached the tower."""

    def __init__(self, runner) -> None:
        self._runner = runner
        self.hidden_size = runner.hidden_size
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def preprocess(self, image):
        return self._runner.preprocess(image)

    def encode(self, prepared):
        self.entered.set()
        if not self.gate.wait(timeout=60):
            raise RuntimeError("test gate was never opened")
        self.calls.append(len(prepared))
        return self._runner.encode(prepared)


def png(seed: int, width: int, height: int) -> bytes:
    """A deterministic noise image as PNG bytes."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def encode_item(family: Family, image: bytes, **overrides) -> encoder_pb2.EncodeItem:
    """An EncodeItem as the gateway builds it: identity, token count and grid from the
    header under the model's rules (`overrides` replace item fields)."""
    header = read_image_header(image)
    token_count, grid = family.adapter.image_token_count(header.width, header.height)
    fields = {
        "modality": common_pb2.IMAGE,
        "identity": image_identity(image, family.fingerprint),
        "token_count": token_count,
        "grid": list(grid),
    }
    fields.update(overrides)
    return encoder_pb2.EncodeItem(image=image, item=common_pb2.MultimodalItem(**fields))


@dataclass
class Stack:
    family: Family
    cache: CacheServer
    encoder: EncoderServer
    runner: CountingRunner
    channel: grpc.aio.Channel
    stub: encoder_pb2_grpc.EncoderStub
    cache_client: AsyncCacheClient
    stopped: bool = field(default=False)

    def request(
        self, items, fingerprint: bytes | None = None, identity_salt: bytes = b""
    ) -> encoder_pb2.EncodeRequest:
        return encoder_pb2.EncodeRequest(
            items=list(items),
            fingerprint=fingerprint or self.family.fingerprint,
            identity_salt=identity_salt,
        )

    async def encode(self, items, **kwargs) -> encoder_pb2.EncodeResponse:
        return await self.stub.Encode(self.request(items), **kwargs)

    async def close(self) -> None:
        self.runner.gate.set()
        await self.channel.close()
        await self.cache_client.close()
        if not self.stopped:
            await self.encoder.stop(grace_s=0)
        await self.cache.stop(grace_s=0)


async def start_stack(
    family: Family, tracer_provider=None, cache_settings: dict | None = None, **settings
) -> Stack:
    """Start a memory-store cache service (with `cache_settings`) and an encoder (with
    `settings`) on free loopback ports."""
    cache = CacheServer(
        CacheSettings(host="127.0.0.1", port=0, metrics_port=0, **(cache_settings or {}))
    )
    await cache.start()
    runner = CountingRunner(family.runner)
    config = {
        "host": "127.0.0.1",
        "port": 0,
        "metrics_port": 0,
        "cache_address": cache.address,
        "preprocess_workers": 2,
        **settings,
    }
    encoder = EncoderServer(
        EncoderSettings(**config),
        model=LoadedModel(runner, family.fingerprint),
        tracer_provider=tracer_provider,
    )
    await encoder.start()
    channel = grpc.aio.insecure_channel(encoder.address, options=GRPC_OPTIONS)
    client = AsyncCacheClient(cache.address, family.fingerprint, timeout_s=30)
    stub = encoder_pb2_grpc.EncoderStub(channel)
    return Stack(family, cache, encoder, runner, channel, stub, client)
