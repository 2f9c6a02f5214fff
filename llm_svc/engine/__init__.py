"""The LLM engine: scheduler, radix prefix cache over paged KV, chunked prefill, sampling,
incremental detokenization (see engine.py for the request loop)."""

from llm_svc.engine.config import EngineConfig
from llm_svc.engine.engine import LLMEngine
from llm_svc.engine.errors import InvalidRequestError, RequestTooLargeError
from llm_svc.engine.kv_events import BlockRemoved, BlockStored, KVEvent, replay
from llm_svc.engine.outputs import EngineStats, RequestOutput
from llm_svc.engine.sampling_params import SamplingParams
from llm_svc.engine.sequence import FinishReason, TokenLogprobs

__all__ = [
    "BlockRemoved",
    "BlockStored",
    "EngineConfig",
    "EngineStats",
    "FinishReason",
    "InvalidRequestError",
    "KVEvent",
    "LLMEngine",
    "RequestOutput",
    "RequestTooLargeError",
    "SamplingParams",
    "TokenLogprobs",
    "replay",
]
