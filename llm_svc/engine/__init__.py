"""The LLM engine: scheduler, radix prefix cache over paged KV, chunked prefill with image
embeddings scattered in, sampling, incremental detokenization (docs/design/engine.md walks one)."""

from llm_svc.engine.config import EngineConfig
from llm_svc.engine.embeddings import (
    CacheEmbeddingSource,
    EmbeddingSource,
    VisionEmbeddingSource,
)
from llm_svc.engine.engine import LLMEngine
from llm_svc.engine.errors import (
    CacheUnavailableError,
    EmbeddingMissingError,
    ImageFailedError,
    InvalidRequestError,
    RequestDataError,
    RequestTooLargeError,
)
from llm_svc.engine.kv_events import BlockRemoved, BlockStored, KVEvent, replay
from llm_svc.engine.outputs import EngineStats, RequestOutput
from llm_svc.engine.sampling_params import SamplingParams
from llm_svc.engine.sequence import FinishReason, TokenLogprobs

__all__ = [
    "BlockRemoved",
    "BlockStored",
    "CacheEmbeddingSource",
    "CacheUnavailableError",
    "EmbeddingMissingError",
    "EmbeddingSource",
    "EngineConfig",
    "EngineStats",
    "FinishReason",
    "ImageFailedError",
    "InvalidRequestError",
    "KVEvent",
    "LLMEngine",
    "RequestDataError",
    "RequestOutput",
    "RequestTooLargeError",
    "SamplingParams",
    "TokenLogprobs",
    "VisionEmbeddingSource",
    "replay",
]
