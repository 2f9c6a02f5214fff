"""What the engine reports per request and step (deltas, for streaming)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_svc.engine.sequence import TokenLogprobs


@dataclass
class RequestOutput:
    """New tokens and text since the last output of this request.

    `text` is released only once it can no longer turn out to be the start of a stop string;
    the final output (finished=True) carries what was held back. `finish_reason` is "stop",
    "length", "abort" or "error" when finished; with "error", `error` is the exception that
    ended the request (ImageFailedError, EmbeddingMissingError, CacheUnavailableError), raised
    before it was accepted unless a preempted request had to fetch again.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool = False
    finish_reason: str | None = None
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    error: Exception | None = None


@dataclass(frozen=True)
class EngineRates:
    """Measured throughputs (llm_svc/engine/rates.py; 0: not measured yet) and what turns
    tokens into bytes, for the gateway's time estimates (GetLoad)."""

    prefill_tokens_per_s: float = 0.0
    host_load_bytes_per_s: float = 0.0
    store_fetch_bytes_per_s: float = 0.0
    kv_bytes_per_token: int = 0  # one token's KV over every layer (0: no host tier)
    kv_store: bool = False


@dataclass(frozen=True)
class TierSnapshot:
    """The host KV tier's figures at one step (llm_svc/engine/host_tier.py, TierStats):
    counters since start, except `load_seconds`, the load times of the requests that
    loaded from host memory since the previous snapshot (each is in exactly one)."""

    page_lookups: dict[str, int]  # full prompt pages by where they were: device, host, miss
    hits: dict[str, int]  # units copied back, by kind: page, window, state
    misses: dict[str, int]  # units host memory held that could not be copied back, by kind
    bytes_to_host: int
    bytes_to_device: int
    load_failures: int
    dropped_full: int  # units the host tier had no room for
    host_hit_tokens: int  # prompt tokens admitted from host memory
    load_seconds: tuple[float, ...]
    fill: float  # share of the tier's bytes in use, 0..1
    capacity_bytes: int


@dataclass(frozen=True)
class StoreSnapshot:
    """The shared KV store's figures at one step (llm_svc/engine/kv_store.py, StoreStats):
    counters since start, except `fetch_seconds`, the lookups' durations since the previous
    snapshot (each is in exactly one)."""

    hits: int  # pages read from the store
    misses: int  # lookups that ended at a page the store did not have
    bytes_read: int
    bytes_written: int
    checksum_failures: int  # values dropped, never served
    dropped_writes: int  # the write queue was full or the store unusable
    skipped_writes: int  # the page's buffer was reused before the writer read it
    errors: int  # failed round trips (the store then left alone for retry_s)
    available: bool
    fetch_seconds: tuple[float, ...]


@dataclass
class EngineStats:
    """Load signals for metrics and routing."""

    running: int
    waiting: int
    kv_utilisation: float
    num_pages: int
    pending_prefill_tokens: int
    preemptions: int
    prompt_tokens: int
    prefix_hit_tokens: int
    generation_tokens: int
    # Sequences of max_model_len tokens the KV pages hold at once, each decoding (a model
    # with sliding layers holds more: their pages past the window are given back).
    sequence_capacity: int = 0
    # Hybrid models: state-snapshot slots, those holding a snapshot, and boundaries passed
    # with none free (those prefixes are no hit).
    snapshot_slots: int = 0
    snapshots_held: int = 0
    snapshots_skipped: int = 0
    # The host KV tier (None: off).
    tier: TierSnapshot | None = None
    # The KV store shared by the pods (None: off).
    store: StoreSnapshot | None = None
    rates: EngineRates = field(default_factory=EngineRates)
    # Speculative decoding by draft method: tokens proposed, accepted, verifications.
    spec_proposed: dict[str, int] = field(default_factory=dict)
    spec_accepted: dict[str, int] = field(default_factory=dict)
    spec_verifications: dict[str, int] = field(default_factory=dict)
