"""Prometheus metric names, label names and default ports of every Iris service.

These constants are the one source of truth: the services register their metrics under
these names, and the operator, the Grafana dashboards and the Helm chart read them from
here (the chart's tests check that every name a dashboard queries is defined below).
"""

from __future__ import annotations

# --- default ports -------------------------------------------------------------------
GATEWAY_HTTP_PORT = 8000
ENCODER_GRPC_PORT = 50051
CACHE_GRPC_PORT = 50052
LLM_GRPC_PORT = 50053
# Each gRPC service also serves /metrics (and /healthz) over plain HTTP on its own port.
ENCODER_METRICS_PORT = 9101
CACHE_METRICS_PORT = 9102
LLM_METRICS_PORT = 9103
OPERATOR_METRICS_PORT = 9104
# The gateway too, on its own port: its client-facing port serves no metrics.
GATEWAY_METRICS_PORT = 9105

DEFAULT_PORTS: dict[str, int] = {
    "gateway": GATEWAY_HTTP_PORT,
    "encoder": ENCODER_GRPC_PORT,
    "cache": CACHE_GRPC_PORT,
    "llm": LLM_GRPC_PORT,
}
METRICS_PORTS: dict[str, int] = {
    "gateway": GATEWAY_METRICS_PORT,
    "encoder": ENCODER_METRICS_PORT,
    "cache": CACHE_METRICS_PORT,
    "llm": LLM_METRICS_PORT,
    "operator": OPERATOR_METRICS_PORT,
}

# --- label names ---------------------------------------------------------------------
LABEL_MODEL = "model"
LABEL_POD = "pod"
# An LLM pod's stable name on the gateway's metrics (Kubernetes' pod name, or `pod-N` until
# the pod tells it), never its address ("pod" is the scrape target's own label).
LABEL_LLM_POD = "llm_pod"
LABEL_OP = "op"  # cache operation: put, get, reserve, wait, ...
LABEL_STORE = "store"  # cache store: memory, redis
LABEL_REASON = "reason"  # discard / failure reason
LABEL_PLUGIN = "plugin"  # routing plugin name
LABEL_SETTING = "setting"  # the gateway setting that refused a request
LABEL_STATUS = "status"  # HTTP or gRPC status
LABEL_ROUTE = "route"  # HTTP route
LABEL_METHOD = "method"  # speculative decoding: the draft method (ngram)
LABEL_WHERE = "where"  # gateway body parse: loop | process
LABEL_DEPLOYMENT = "deployment"  # operator: encoder | llm
LABEL_KIND = "kind"  # operator: encoder | llm; LLM pod's host KV tier: page | window | state
LABEL_TIER = "tier"  # LLM pod's KV page lookups: device | host | miss
# LLM pod's KV tier copies: to_host | to_device; its KV store's bytes: read | written
LABEL_DIRECTION = "direction"
LABEL_STAGE = "stage"  # encoder: claim, prepare, batch_wait, tower, store

# --- LLM pod (llm_svc) ---------------------------------------------------------------
LLM_KV_UTILISATION = "iris_llm_kv_cache_utilisation"  # gauge, 0..1
# gauge: max_model_len sequences the KV pages hold at once (more with sliding layers' pages)
LLM_KV_SEQUENCE_CAPACITY = "iris_llm_kv_sequence_capacity"
LLM_REQUESTS_RUNNING = "iris_llm_requests_running"  # gauge
LLM_REQUESTS_WAITING = "iris_llm_requests_waiting"  # gauge
LLM_PENDING_PREFILL_TOKENS = "iris_llm_pending_prefill_tokens"  # gauge
LLM_PREFIX_HIT_RATE = "iris_llm_prefix_cache_hit_rate"  # gauge, 0..1 (tokens)
LLM_PREFIX_HIT_TOKENS = "iris_llm_prefix_cache_hit_tokens_total"  # counter
LLM_PROMPT_TOKENS = "iris_llm_prompt_tokens_total"  # counter
LLM_GENERATION_TOKENS = "iris_llm_generation_tokens_total"  # counter
LLM_IMAGE_TOKENS = "iris_llm_image_tokens_total"  # counter
LLM_TTFT_SECONDS = "iris_llm_time_to_first_token_seconds"  # histogram
LLM_TPOT_SECONDS = "iris_llm_time_per_output_token_seconds"  # histogram
LLM_TOKENS_PER_SECOND = "iris_llm_tokens_per_second"  # gauge
LLM_REQUESTS_FINISHED = "iris_llm_requests_finished_total"  # counter, label reason
LLM_PREEMPTIONS = "iris_llm_preemptions_total"  # counter
# Speculative decoding, by draft method (LABEL_METHOD): draft tokens proposed, accepted, and
# verifications (chunks that carried drafts). Mean accepted length = (accepted +
# verifications) / verifications, the tokens one verification yields.
LLM_SPEC_DRAFT_TOKENS = "iris_llm_spec_draft_tokens_total"  # counter
LLM_SPEC_ACCEPTED_TOKENS = "iris_llm_spec_accepted_tokens_total"  # counter
LLM_SPEC_VERIFICATIONS = "iris_llm_spec_verifications_total"  # counter
LLM_GRAMMAR_COMPILES = "iris_llm_grammar_compiles_total"  # counter: compiles started
LLM_GRAMMAR_COMPILE_TIMEOUTS = "iris_llm_grammar_compile_timeouts_total"  # counter: workers killed
# The host KV tier (IRIS_LLM_HOST_KV_BYTES; docs/design/engine.md, "KV tiers"), every series
# exported from the start, at 0 on a pod without the tier. Full pages of admitted prompts'
# resumable prefixes by where they were (label tier: device | host | miss).
LLM_KV_TIER_PAGES = "iris_llm_kv_tier_pages_total"  # counter, label tier
# Units copied back from host memory, and units it held that could not be (no device room,
# or a failed copy), label kind: page | window | state.
LLM_KV_TIER_HITS = "iris_llm_kv_tier_hits_total"  # counter, label kind
LLM_KV_TIER_MISSES = "iris_llm_kv_tier_misses_total"  # counter, label kind
LLM_KV_TIER_BYTES = "iris_llm_kv_tier_bytes_total"  # counter, label direction
LLM_KV_TIER_LOAD_FAILURES = "iris_llm_kv_tier_load_failures_total"  # counter: failed copies back
LLM_KV_TIER_DROPPED = "iris_llm_kv_tier_dropped_total"  # counter: units the tier had no room for
# histogram: per request that loaded from host memory, the time its loads took
LLM_KV_TIER_LOAD_SECONDS = "iris_llm_kv_tier_load_seconds"
LLM_KV_TIER_FILL_RATIO = "iris_llm_kv_tier_fill_ratio"  # gauge, 0..1 of the tier's bytes
LLM_KV_TIER_CAPACITY_BYTES = "iris_llm_kv_tier_capacity_bytes"  # gauge (0: no tier)
# counter: prompt tokens served from host memory (the host part of the prefix-cache hits)
LLM_KV_TIER_HOST_HIT_TOKENS = "iris_llm_kv_tier_host_hit_tokens_total"
# The KV store shared by the pods (IRIS_LLM_KV_STORE; llm_svc/engine/kv_store.py), every
# series exported from the start, at 0 on a pod without a store (configured 0).
LLM_KV_STORE_CONFIGURED = "iris_llm_kv_store_configured"  # gauge: 1 a store is set, 0 off
# gauge: 1 the store answers (or is tried again after retry_s), 0 it failed or is off
LLM_KV_STORE_UP = "iris_llm_kv_store_up"
LLM_KV_STORE_HITS = "iris_llm_kv_store_hits_total"  # counter: pages read from the store
# counter: lookups that ended at a page the store did not hold (a run's end, not per page)
LLM_KV_STORE_MISSES = "iris_llm_kv_store_misses_total"
LLM_KV_STORE_BYTES = "iris_llm_kv_store_bytes_total"  # counter, label direction: read | written
LLM_KV_STORE_FETCH_SECONDS = "iris_llm_kv_store_fetch_seconds"  # histogram: per lookup
# counter: values whose checksum failed (dropped, never served)
LLM_KV_STORE_CHECKSUM_FAILURES = "iris_llm_kv_store_checksum_failures_total"
# counter: pages not written (the write queue full, or the store failing)
LLM_KV_STORE_DROPPED_WRITES = "iris_llm_kv_store_dropped_writes_total"
# counter: pages not written because their buffer was reused before the writer read it
LLM_KV_STORE_SKIPPED_WRITES = "iris_llm_kv_store_skipped_writes_total"
LLM_KV_STORE_ERRORS = "iris_llm_kv_store_errors_total"  # counter: failed round trips

# --- encoder (encoder_svc) -----------------------------------------------------------
ENCODER_QUEUED_IMAGES = "iris_encoder_queued_images"  # gauge
ENCODER_QUEUED_VISION_TOKENS = "iris_encoder_queued_vision_tokens"  # gauge
ENCODER_BUSY_RATIO = "iris_encoder_busy_ratio"  # gauge, 0..1
ENCODER_BATCH_SIZE = "iris_encoder_batch_size_images"  # histogram
ENCODER_STAGE_SECONDS = "iris_encoder_stage_seconds"  # histogram, label stage
ENCODER_DEDUP_RATIO = "iris_encoder_dedup_ratio"  # gauge, 0..1
ENCODER_IMAGES = "iris_encoder_images_total"  # counter (encoded)
ENCODER_VISION_TOKENS = "iris_encoder_vision_tokens_total"  # counter
ENCODER_IMAGES_PER_SECOND = "iris_encoder_images_per_second"  # gauge
ENCODER_VISION_TOKENS_PER_SECOND = "iris_encoder_vision_tokens_per_second"  # gauge
ENCODER_FAILED_IMAGES = "iris_encoder_failed_images_total"  # counter, label reason
ENCODER_REJECTED = "iris_encoder_rejected_total"  # counter (backpressure)

# --- embedding cache (embedding_cache_svc) -------------------------------------------
CACHE_HITS = "iris_cache_hits_total"  # counter
CACHE_MISSES = "iris_cache_misses_total"  # counter
CACHE_DISCARDS = "iris_cache_validation_discards_total"  # counter, label reason
CACHE_EVICTIONS = "iris_cache_evictions_total"  # counter
CACHE_BYTES = "iris_cache_bytes_stored"  # gauge
CACHE_ENTRIES = "iris_cache_entries"  # gauge
CACHE_RESERVATIONS = "iris_cache_reservations_total"  # counter, label status
CACHE_LATENCY_SECONDS = "iris_cache_op_latency_seconds"  # histogram, label op
CACHE_STORE_ERRORS = "iris_cache_store_errors_total"  # counter, label store

# --- gateway -------------------------------------------------------------------------
GATEWAY_REQUESTS = "iris_gateway_requests_total"  # counter, labels route, status
GATEWAY_REQUEST_SECONDS = "iris_gateway_request_seconds"  # histogram, label route
GATEWAY_TTFT_SECONDS = "iris_gateway_time_to_first_token_seconds"  # histogram
GATEWAY_OVERHEAD_SECONDS = "iris_gateway_overhead_seconds"  # histogram (intake + route)
GATEWAY_ROUTING_PLUGIN_SECONDS = "iris_gateway_routing_plugin_seconds"  # histogram, plugin
GATEWAY_PREFIX_HIT_RATIO = "iris_gateway_routed_prefix_ratio"  # histogram, 0..1
GATEWAY_EMBEDDING_HITS = "iris_gateway_embedding_hits_total"  # counter
GATEWAY_ENCODE_DISPATCHED = "iris_gateway_encode_dispatched_total"  # counter
GATEWAY_RETRIES = "iris_gateway_retries_total"  # counter, label reason
# Callers' mm_hashes entries that were not the images' computed identities (ignored).
GATEWAY_MM_HASHES_IGNORED = "iris_gateway_mm_hashes_ignored_total"  # counter
# Videos decoded by the gateway's decode pool: each one's wall time (queueing for a worker
# included) and the decoded seconds of video (docs/design/multimodal.md, "Video").
GATEWAY_VIDEO_DECODE_SECONDS = "iris_gateway_video_decode_seconds"  # histogram
GATEWAY_VIDEO_SECONDS = "iris_gateway_video_seconds_total"  # counter
# counters: decode jobs sent to the pool, frames they decoded, and videos refused before or
# while decoding, label setting (the gateway setting that refused it, "video" for a file
# that is not a readable video)
GATEWAY_VIDEO_DECODES = "iris_gateway_video_decodes_total"
GATEWAY_VIDEO_FRAMES_DECODED = "iris_gateway_video_frames_decoded_total"
GATEWAY_VIDEO_REFUSALS = "iris_gateway_video_refusals_total"
# gauge: bytes of decoded video frames the gateway holds or has reserved
GATEWAY_VIDEO_INFLIGHT_BYTES = "iris_gateway_video_inflight_bytes"
# counter, label where: loop | process (request bodies parsed on the event loop or in a
# parse worker process, docs/design/door.md)
GATEWAY_BODY_PARSES = "iris_gateway_body_parses_total"
# This gateway's placements per LLM pod (routing's own count; label llm_pod = address).
GATEWAY_POD_REQUESTS_IN_FLIGHT = "iris_gateway_pod_requests_in_flight"  # gauge
GATEWAY_POD_PREFILL_TOKENS_IN_FLIGHT = "iris_gateway_pod_prefill_tokens_in_flight"  # gauge
# The last KV event seq of each LLM pod that this gateway's prefix index has applied.
GATEWAY_POD_KV_EVENT_SEQ = "iris_gateway_pod_kv_event_seq"  # gauge, label llm_pod
# Routing accuracy (gateway/routing/accuracy.py): per request, the prefix tokens routing
# predicted the chosen pod holds against the pod's cached_tokens at admission.
GATEWAY_ROUTING_PREFIX_ERROR_TOKENS = "iris_gateway_routing_prefix_error_tokens"  # histogram
GATEWAY_ROUTING_OVER_PREDICTIONS = "iris_gateway_routing_over_predictions_total"  # counter
GATEWAY_ROUTING_UNDER_PREDICTIONS = "iris_gateway_routing_under_predictions_total"  # counter
# Requests whose prediction was > 0, and those of them within one page of the pod's answer.
GATEWAY_ROUTING_PREDICTED = "iris_gateway_routing_predicted_total"  # counter
GATEWAY_ROUTING_PREDICTED_WITHIN_PAGE = "iris_gateway_routing_predicted_within_page_total"
# Routing regret (gateway/routing/regret.py): per accepted request, the prompt tokens its pod
# computed that another healthy pod held by routing's index, label reason: load, saturation,
# tie, stale_index (the histogram also none: nothing lost); and every accepted prompt's
# tokens, the share's denominator.
GATEWAY_ROUTING_REGRET_TOKENS = "iris_gateway_routing_regret_tokens_total"  # counter, reason
GATEWAY_ROUTING_REQUEST_REGRET_TOKENS = "iris_gateway_routing_request_regret_tokens"  # histogram
GATEWAY_ROUTING_PROMPT_TOKENS = "iris_gateway_routing_prompt_tokens_total"  # counter

# --- operator ------------------------------------------------------------------------
OPERATOR_DESIRED_REPLICAS = "iris_operator_desired_replicas"  # gauge, labels deployment,kind
OPERATOR_CURRENT_REPLICAS = "iris_operator_current_replicas"  # gauge, labels deployment,kind
OPERATOR_SCRAPE_FAILURES = "iris_operator_scrape_failures_total"  # counter, label pod
OPERATOR_SCALE_EVENTS = "iris_operator_scale_events_total"  # counter, labels kind, reason


def all_metric_names() -> set[str]:
    """Every metric name defined in this module (dashboards are checked against it)."""
    return {
        value
        for name, value in globals().items()
        if name.isupper() and isinstance(value, str) and value.startswith("iris_")
    }
