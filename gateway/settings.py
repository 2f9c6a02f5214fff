"""The gateway's one Settings object (env prefix IRIS_GATEWAY_), read once at start."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from gateway.clients.channels import MAX_MESSAGE_BYTES
from iris.metrics import GATEWAY_HTTP_PORT, GATEWAY_METRICS_PORT
from iris.multimodal.video import VideoLimits
from iris.settings import AddressList, GrpcServiceSettings, StringList


class GatewaySettings(GrpcServiceSettings):
    """Everything the gateway reads from its environment; passed down through constructors."""

    model_config = SettingsConfigDict(
        env_prefix="IRIS_GATEWAY_", extra="forbid", validate_default=True
    )

    port: int = Field(GATEWAY_HTTP_PORT, ge=1, le=65535)
    # /metrics and /healthz on their own port, as every service (0: any free port); the
    # client-facing port serves no metrics (they name pods).
    metrics_port: int = Field(GATEWAY_METRICS_PORT, ge=0, le=65535)

    model: str  # local HF model directory: tokenizer, chat template, processor config
    # The weights' name (an HF commit hash, or any version the deployer gives; chart
    # `model.revision`): part of the fingerprint, so caches never mix two fine-tunes. Empty:
    # a BLAKE3 digest of the weight files stands for it (computed once per directory).
    model_revision: str = ""
    served_model_name: str | None = None  # the id clients send; default: the directory name

    llm_addresses: AddressList = Field(default_factory=list)
    encoder_addresses: AddressList = Field(default_factory=list)
    cache_address: str = "127.0.0.1:50052"
    discovery: Literal["static", "endpointslices"] = "static"
    # EndpointSlice discovery: the Services whose slices list the pods.
    namespace: str = "default"
    llm_service: str = "iris-llm"
    encoder_service: str = "iris-encoder"
    discovery_interval_s: float = Field(5.0, gt=0)

    router_config: str = "prefix-aware"  # a built-in policy name or a YAML file path
    api_keys: StringList = []  # JSON list or comma-separated; none: open (loopback use)
    # Per-key admission (gateway/key_limits.py): token buckets per API key; a rate of 0 is
    # no limit. Bursts are what a key may spend at once.
    key_requests_per_s: float = Field(0.0, ge=0)
    key_request_burst: int = Field(20, gt=0)
    key_prompt_tokens_per_s: float = Field(0.0, ge=0)
    key_prompt_token_burst: int = Field(100_000, gt=0)
    key_completion_tokens_per_s: float = Field(0.0, ge=0)  # charged as tokens are produced
    key_completion_tokens_burst: int = Field(100_000, gt=0)
    embedding_reuse: bool = True  # skip Reserve/Encode for images the pod's prefix covers

    # Tenant isolation (gateway/tenancy.py): `shared` salts only requests that send a
    # cache_salt; `per-key` gives every API key its own salt by default. Unset: per-key
    # whenever API keys are required, shared when the gateway is open (as the chart does).
    tenancy: Literal["shared", "per-key"] | None = None
    max_cache_salt_chars: int = Field(256, gt=0)
    # Debugging only: name the LLM pod(s) that served a request in an X-Iris-Pod header
    # (off by default: clients should not learn internal addresses).
    debug_pod_header: bool = False

    # Image intake.
    allow_remote_images: bool = False
    remote_image_hosts: StringList = []  # allow-list: "example.com" or "*.example.com"
    remote_image_timeout_s: float = Field(5.0, gt=0)
    max_image_bytes: int = Field(20 * 1024 * 1024, gt=0)
    max_image_pixels: int = Field(40_000_000, gt=0)
    max_images_per_request: int = Field(16, gt=0)
    # Video intake (docs/design/multimodal.md): the work the gateway's decode pool may spend
    # on one video; each refusal is a 400 naming its setting. `video_max_groups` bounds a
    # request's frame groups over all its videos (not `max_images_per_request`). A `data:`
    # video is also bounded by `max_body_bytes`.
    video_max_bytes: int = Field(16 * 1024 * 1024, gt=0)  # one container file
    video_max_duration_s: float = Field(300.0, gt=0)
    video_max_frames: int = Field(600, gt=0)  # sampled frames of one video
    video_max_frame_pixels: int = Field(3840 * 2160, gt=0)  # one decoded frame
    video_max_total_pixels: int = Field(600 * 1920 * 1080, gt=0)  # sampled, before resizing
    video_max_groups: int = Field(300, gt=0)  # frame groups per request
    video_max_decode_s: float = Field(30.0, gt=0)
    video_decode_workers: int = Field(1, gt=0)  # spawned decode processes
    max_videos_per_request: int = Field(2, gt=0)  # video_url parts in one request
    # Gateway-wide: bytes of decoded frames held or reserved (gateway/intake/video_memory.py);
    # a video that would pass it waits up to the timeout, then gets a 503 with Retry-After.
    video_max_inflight_bytes: int = Field(512 * 1024 * 1024, gt=0)
    video_queue_timeout_s: float = Field(10.0, ge=0)
    # Per-route body caps (docs/design/door.md): parsing holds the event loop for the
    # whole body, so each route's bytes and JSON values (commas + 1) are bounded before it.
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)  # /v1/chat/completions (images)
    max_completions_body_bytes: int = Field(4 * 1024 * 1024, gt=0)  # /v1/completions
    max_body_values: int = Field(131_072, gt=0)  # both routes
    max_body_objects: int = Field(8192, gt=0)  # both routes
    body_timeout_s: float = Field(30.0, gt=0)  # the whole body must arrive within this
    # Bodies over this many bytes are parsed and validated in one of `parse_workers`
    # processes, not on the event loop (gateway/parsing/); 0 workers: all on the loop.
    parse_in_process_max_bytes: int = Field(32 * 1024, ge=0)
    parse_workers: int = Field(2, ge=0)
    header_timeout_s: float = Field(10.0, gt=0)  # and the request line and headers in this
    # Per request, across all its images (beside the per-image limits above).
    max_request_image_bytes: int = Field(64 * 1024 * 1024, gt=0)
    max_request_image_pixels: int = Field(100_000_000, gt=0)
    # The largest Encode message sent (images of one request to encode); over it, a 413.
    max_encode_message_bytes: int = Field(MAX_MESSAGE_BYTES, gt=0, le=MAX_MESSAGE_BYTES)
    # Items per Encode message (at most the encoders' max_items_per_request): a request
    # with more to encode, a video's frame groups, sends several in turn.
    max_encode_items: int = Field(64, gt=0)
    # Open connections (counted by gateway/http_protocol.py) and HTTP requests in progress
    # (gateway/middleware.py): past either, a JSON 503 with Retry-After.
    max_connections: int = Field(1024, gt=1)
    max_requests_in_progress: int = Field(1024, gt=0)

    # Generation limits.
    max_model_len: int | None = Field(None, gt=0)  # default: the pods' (or the config's)
    max_n: int = Field(8, gt=0)
    # What one whole (non-streamed) response may hold until it is sent: the sum over its
    # choices of max_tokens x (1 + top_logprobs); over it, a 400 (a stream keeps nothing).
    max_response_tokens: int = Field(1_000_000, gt=0)
    max_concurrent_requests: int = Field(256, gt=0)
    retry_after_s: int = Field(1, ge=1)
    # Capacity-based admission (gateway/routing/capacity.py): a pod takes a request while
    # its requests in flight are under its limit and its queued prefill tokens under the
    # bound (0: no bound); when no pod does, 429 at once with Retry-After from the pods'
    # measured drain rates. The limit adapts between 1 and max_inflight_per_pod: it shrinks
    # while first tokens take longer than admission_wait_factor x the pod's usual least
    # wait (its recent 10th percentile; 0: the limit stays at max_inflight_per_pod).
    max_inflight_per_pod: int = Field(64, ge=0)
    admission_wait_factor: float = Field(2.0, ge=0)
    max_queued_prefill_tokens_per_pod: int = Field(16384, ge=0)
    max_retry_after_s: int = Field(30, ge=1)
    # Structured output: a JSON schema (response_format or one tool's parameters) at most
    # this many bytes and levels deep; at most this many tools. (Pods hold their own limits
    # and the compile timeout.)
    max_schema_bytes: int = Field(64 * 1024, gt=0)
    max_schema_depth: int = Field(32, gt=0)
    max_tools: int = Field(128, gt=0)
    # The grammar's static check (gateway/api/grammar_limits.py), before any pod compiles
    # it: one repetition bound ({m,n}, min/maxLength, min/maxItems...), the bounds nested
    # and summed over the constraint, one enum's values, the constraint's bytes.
    grammar_max_repeat: int = Field(1000, gt=0)
    grammar_max_total_repeat: int = Field(100_000, gt=0)
    grammar_max_enum: int = Field(1000, gt=0)
    grammar_max_bytes: int = Field(256 * 1024, gt=0)

    # Leases and timing of the calls the gateway makes.
    lease_ms: int = Field(30_000, gt=0)
    grpc_timeout_s: float = Field(10.0, gt=0)
    accept_timeout_s: float = Field(120.0, gt=0)
    # After acceptance: a pod that sends nothing for this long ends the request with an
    # `upstream_timeout` error (504, or an SSE error event then [DONE]); and every
    # Generate call carries a gRPC deadline of `generate_timeout_s` from its start.
    stream_idle_s: float = Field(60.0, gt=0)
    generate_timeout_s: float = Field(3600.0, gt=0)
    load_poll_interval_s: float = Field(0.5, gt=0)
    # On SIGTERM, requests may finish for this long; streams still open a second before it
    # ends close with a `shutting_down` error event (gateway/serving.py).
    shutdown_grace_s: float = Field(5.0, ge=2)

    @model_validator(mode="after")
    def _default_tenancy(self):
        if self.tenancy is None:
            self.tenancy = "per-key" if self.api_keys else "shared"
        return self

    def video_limits(self) -> VideoLimits:
        """The `video_*` settings as the decoder's bounds."""
        return VideoLimits(
            max_bytes=self.video_max_bytes,
            max_duration_s=self.video_max_duration_s,
            max_frames=self.video_max_frames,
            max_frame_pixels=self.video_max_frame_pixels,
            max_total_pixels=self.video_max_total_pixels,
            max_groups=self.video_max_groups,
            max_decode_s=self.video_max_decode_s,
        )

    @property
    def model_name(self) -> str:
        """The model id clients use: the served name, else the model directory's name."""
        from pathlib import Path

        return self.served_model_name or Path(self.model).name
