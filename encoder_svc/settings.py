"""Settings of the encoder service (env prefix ``IRIS_ENCODER_``), read once at start."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from iris.metrics import CACHE_GRPC_PORT, ENCODER_GRPC_PORT, ENCODER_METRICS_PORT
from iris.multimodal import DecodePolicy
from iris.settings import GrpcServiceSettings

_POLICY = DecodePolicy()


class EncoderSettings(GrpcServiceSettings):
    """Everything `iris encoder` reads from the environment.

    Batching: a batch closes when it holds `max_batch_images` images or
    `max_batch_vision_tokens` tokens, `max_wait_ms` after its first item arrived, or as
    soon as no other admitted image is still being claimed or preprocessed.
    Backpressure: at most `max_queue_vision_tokens` tokens of distinct work are accepted and
    not yet stored; beyond that a request is refused with RESOURCE_EXHAUSTED.
    """

    model_config = SettingsConfigDict(
        env_prefix="IRIS_ENCODER_", extra="forbid", validate_default=True
    )

    model: str = ""  # local HF model directory (required to serve)
    # The weights' name (an HF commit hash, or any version the deployer gives; chart
    # `model.revision`): part of the fingerprint, so caches never mix two fine-tunes. Empty:
    # a BLAKE3 digest of the weight files stands for it (computed once per directory).
    model_revision: str = ""
    cache_address: str = f"127.0.0.1:{CACHE_GRPC_PORT}"
    device: Literal["cpu", "cuda"] = "cpu"  # cuda runs the tower in bfloat16
    # The dtype embeddings are stored in; auto: the tower's own. Readers convert on read.
    embedding_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    port: int = Field(ENCODER_GRPC_PORT, ge=0, le=65535)
    metrics_port: int = Field(ENCODER_METRICS_PORT, ge=0, le=65535)

    max_batch_images: int = Field(32, gt=0)
    max_batch_vision_tokens: int = Field(8192, gt=0)
    max_wait_ms: float = Field(5.0, ge=0)
    max_queue_vision_tokens: int = Field(65536, gt=0)
    # Decode + resize threads beside the tower thread; raise it on many-core GPU nodes.
    preprocess_workers: int = Field(2, gt=0)
    # How long this encoder's cache leases live; it extends them every third of this while
    # it works, so it bounds how long a dead encoder blocks an image, not an encode's time.
    lease_ms: int = Field(60_000, gt=0)
    shutdown_grace_s: float = Field(5.0, ge=0)  # drain time before in-flight items fail
    # Readiness (gRPC health): NOT_SERVING while the batch loop is dead or one batch has
    # run for `batch_stall_s`; checked every interval.
    batch_stall_s: float = Field(60.0, gt=0)
    health_interval_s: float = Field(1.0, gt=0)

    max_items_per_request: int = Field(64, gt=0)
    max_item_vision_tokens: int = Field(16384, gt=0)
    max_image_bytes: int = Field(_POLICY.max_bytes, gt=0)
    max_image_pixels: int = Field(_POLICY.max_pixels, gt=0)
    max_message_bytes: int = Field(128 << 20, ge=4 << 20)  # gRPC receive limit
    max_concurrent_rpcs: int = Field(512, gt=0)
    torch_threads: int = Field(0, ge=0)  # 0: leave torch's default

    @model_validator(mode="after")
    def _check_limits(self) -> EncoderSettings:
        if self.max_item_vision_tokens > self.max_queue_vision_tokens:
            raise ValueError(
                f"max_item_vision_tokens {self.max_item_vision_tokens} exceeds "
                f"max_queue_vision_tokens {self.max_queue_vision_tokens}: such an item could "
                "never be admitted"
            )
        return self

    def decode_policy(self) -> DecodePolicy:
        """The image decode policy with this service's byte and pixel limits."""
        return DecodePolicy(max_bytes=self.max_image_bytes, max_pixels=self.max_image_pixels)
