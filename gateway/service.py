"""The gateway's parts, built once from Settings: intake, router, registry, clients.

Routes reach it through `request.app.state.gateway` (see gateway/api/deps.py).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

from gateway.auth import KeyRing
from gateway.clients.cache import CacheClient
from gateway.clients.encoders import EncoderPool
from gateway.dispatch import Dispatcher
from gateway.errors import APIError
from gateway.intake.prompt import PromptBuilder
from gateway.intake.remote import RemoteImageFetcher
from gateway.intake.video_memory import VideoMemory
from gateway.intake.videos import VideoDecoder
from gateway.key_limits import KeyLimits
from gateway.parsing.pool import BodyParser
from gateway.routing.capacity import PodCapacity
from gateway.routing.config import load_router_config
from gateway.routing.discovery import EndpointSliceDiscovery
from gateway.routing.kv_index import KVIndex
from gateway.routing.registry import PodRegistry
from gateway.routing.router import Router
from gateway.settings import GatewaySettings
from gateway.tenancy import (
    RequestSalts,
    Tenancy,
    bearer_key,
    check_cache_salt,
    request_salts,
    tenant_salt,
)
from gateway.worker_pool import WorkerPool
from iris.multimodal import DecodePolicy, check_vocab_size

log = logging.getLogger(__name__)


class Admission:
    """At most `limit` requests in flight; over it, 429 with Retry-After."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.in_flight = 0

    def enter(self) -> None:
        if self.in_flight >= self.limit:
            raise APIError(
                429,
                f"{self.in_flight} requests in flight, the gateway's limit is {self.limit}",
                code="overloaded",
                retry_after=self.retry_after_s,
            )
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1


class Gateway:
    """Everything a request needs; `start`/`stop` run discovery and the pod watchers."""

    def __init__(self, settings: GatewaySettings, adapter=None) -> None:
        if adapter is None:
            from iris.models import load_adapter

            adapter = load_adapter(settings.model, revision=settings.model_revision)
        self.settings = settings
        self.adapter = adapter
        self.fingerprint: bytes = adapter.fingerprint
        check_vocab_size(int(adapter.vocab_size))
        policy = DecodePolicy(
            max_bytes=settings.max_image_bytes, max_pixels=settings.max_image_pixels
        )
        fetcher = RemoteImageFetcher(
            enabled=settings.allow_remote_images,
            allow_list=settings.remote_image_hosts,
            max_bytes=settings.max_image_bytes,
            timeout_s=settings.remote_image_timeout_s,
        )
        self.prompts = PromptBuilder(
            adapter,
            policy=policy,
            fetcher=fetcher,
            max_images=settings.max_images_per_request,
            max_request_image_bytes=settings.max_request_image_bytes,
            max_request_image_pixels=settings.max_request_image_pixels,
            max_model_len=self.max_model_len,
            # Videos decode in spawned processes (gateway/intake/videos.py), started at the
            # first video; a model that takes no video gets no pool.
            videos=VideoDecoder(
                settings.video_decode_workers,
                settings.video_limits(),
                settings.retry_after_s,
                VideoMemory(
                    settings.video_max_inflight_bytes,
                    settings.video_queue_timeout_s,
                    settings.retry_after_s,
                ),
            )
            if adapter.takes_video
            else None,
            max_videos=settings.max_videos_per_request,
        )
        self.index = KVIndex()
        capacity = PodCapacity(
            max_inflight=settings.max_inflight_per_pod,
            max_queued_prefill_tokens=settings.max_queued_prefill_tokens_per_pod,
            wait_factor=settings.admission_wait_factor,
            default_retry_after_s=settings.retry_after_s,
            max_retry_after_s=settings.max_retry_after_s,
        )
        self.router = Router(
            load_router_config(settings.router_config), self.index, settings.retry_after_s, capacity
        )
        self.admission = Admission(settings.max_concurrent_requests, settings.retry_after_s)
        self.keys = KeyRing(settings.api_keys)
        self.key_limits = KeyLimits(
            requests_per_s=settings.key_requests_per_s,
            request_burst=settings.key_request_burst,
            prompt_tokens_per_s=settings.key_prompt_tokens_per_s,
            prompt_token_burst=settings.key_prompt_token_burst,
            completion_tokens_per_s=settings.key_completion_tokens_per_s,
            completion_token_burst=settings.key_completion_tokens_burst,
        )
        # Large bodies are parsed in worker processes (started by `serve`, else at the
        # first large body): gateway/parsing/.
        self.bodies = BodyParser(
            settings.parse_workers, settings.parse_in_process_max_bytes, settings.retry_after_s
        )
        # Set when open streams must end (the server is stopping): see begin_drain.
        self.streams_ending = asyncio.Event()
        self.registry: PodRegistry | None = None
        self.dispatcher: Dispatcher | None = None
        self._tasks: list[asyncio.Task] = []

    # -- lifecycle (inside the event loop) ---------------------------------------------------

    async def start(self) -> None:
        settings = self.settings
        self.registry = PodRegistry(
            self.index,
            self.fingerprint,
            poll_interval_s=settings.load_poll_interval_s,
            timeout_s=settings.grpc_timeout_s,
            tls=settings.tls(),
        )
        self.cache = CacheClient(
            settings.cache_address, self.fingerprint, settings.grpc_timeout_s, settings.tls()
        )
        self.encoders = EncoderPool(self.fingerprint, settings.accept_timeout_s, settings.tls())
        self.dispatcher = Dispatcher(
            router=self.router,
            registry=self.registry,
            cache=self.cache,
            encoders=self.encoders,
            fingerprint=self.fingerprint,
            lease_ms=settings.lease_ms,
            accept_timeout_s=settings.accept_timeout_s,
            stream_idle_s=settings.stream_idle_s,
            generate_timeout_s=settings.generate_timeout_s,
            embedding_reuse=settings.embedding_reuse,
            max_encode_bytes=settings.max_encode_message_bytes,
            max_encode_items=settings.max_encode_items,
        )
        if settings.discovery == "static":
            await self.registry.set_addresses(settings.llm_addresses)
            await self.encoders.set_addresses(settings.encoder_addresses)
            return
        for service, on_change in (
            (settings.llm_service, self.registry.set_addresses),
            (settings.encoder_service, self.encoders.set_addresses),
        ):
            discovery = EndpointSliceDiscovery(
                settings.namespace, service, on_change, interval_s=settings.discovery_interval_s
            )
            self._tasks.append(asyncio.create_task(discovery.run(), name=f"discover {service}"))

    def begin_drain(self, streams_end_after_s: float) -> None:
        """The server is stopping: streams still open after `streams_end_after_s` end with
        an error event and [DONE] (rather than being cut mid-chunk when the server's
        graceful shutdown runs out). Call from the event loop."""
        asyncio.get_running_loop().call_later(streams_end_after_s, self.streams_ending.set)

    async def stop(self) -> None:
        await self.bodies.stop()
        if self.prompts.videos is not None:
            await self.prompts.videos.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with suppress(asyncio.CancelledError):
                await task
        if self.dispatcher is not None:
            # An encode still in flight finishes (or abandons its lease) before the channels
            # close; a request's response may have gone before its Encode was even sent.
            await self.dispatcher.settle(self.settings.accept_timeout_s)
        if self.registry is not None:
            await self.registry.close()
            await self.encoders.close()
            await self.cache.close()

    # -- facts routes need -----------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.settings.model_name

    def check_model(self, requested: str) -> None:
        """404 for a model id this gateway does not serve (OpenAI's behaviour)."""
        if requested != self.model_name:
            raise APIError(
                404,
                f"model {requested[:100]!r} does not exist; this gateway serves "
                f"{self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def salts(self, authorization: str | None, cache_salt: object) -> RequestSalts:
        """The request's salts from its `cache_salt` (checked: a bad one is a 400) and,
        under per-key tenancy, its API key (gateway/tenancy.py)."""
        settings = self.settings
        tenant = tenant_salt(
            Tenancy(settings.tenancy),
            check_cache_salt(cache_salt, settings.max_cache_salt_chars),
            bearer_key(authorization),
        )
        return request_salts(tenant, settings.embedding_reuse)

    def max_model_len(self) -> int:
        """The context length: the setting, else the smallest a pod reports, else the config."""
        if self.settings.max_model_len:
            return self.settings.max_model_len
        lengths = [pod.max_model_len for pod in self.pods() if pod.usable and pod.max_model_len]
        if lengths:
            return min(lengths)
        text = self.adapter.text_config
        return int(text.get("max_position_embeddings") or 4096)

    def pods(self):
        return self.registry.pods() if self.registry is not None else []

    def ready(self) -> bool:
        return any(pod.usable for pod in self.pods())

    def worker_pools(self) -> list[WorkerPool]:
        """The process pools a request may need: the body parser's and the video decoder's."""
        pools = [self.bodies.pool] if self.bodies.workers > 0 else []
        if self.prompts.videos is not None:
            pools.append(self.prompts.videos.pool)
        return pools
