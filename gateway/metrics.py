"""The gateway's Prometheus metrics, registered once per process under iris.metrics names."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

from iris import metrics as names

_FAST = (0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1)
_SLOW = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

REQUESTS = Counter(names.GATEWAY_REQUESTS, "HTTP requests", [names.LABEL_ROUTE, names.LABEL_STATUS])
REQUEST_SECONDS = Histogram(
    names.GATEWAY_REQUEST_SECONDS, "HTTP request duration", [names.LABEL_ROUTE], buckets=_SLOW
)
TTFT_SECONDS = Histogram(names.GATEWAY_TTFT_SECONDS, "time to first token", buckets=_SLOW)
OVERHEAD_SECONDS = Histogram(
    names.GATEWAY_OVERHEAD_SECONDS, "gateway intake + routing time per request", buckets=_FAST
)
ROUTING_PLUGIN_SECONDS = Histogram(
    names.GATEWAY_ROUTING_PLUGIN_SECONDS,
    "time per routing plugin call",
    [names.LABEL_PLUGIN],
    buckets=_FAST,
)
PREFIX_HIT_RATIO = Histogram(
    names.GATEWAY_PREFIX_HIT_RATIO,
    "share of the prompt's blocks the chosen pod holds",
    buckets=(0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
)
EMBEDDING_HITS = Counter(
    names.GATEWAY_EMBEDDING_HITS, "images that needed no encoding (prefix or cache)"
)
ENCODE_DISPATCHED = Counter(names.GATEWAY_ENCODE_DISPATCHED, "images sent to an encoder")
RETRIES = Counter(names.GATEWAY_RETRIES, "dispatch retries", [names.LABEL_REASON])
VIDEO_DECODE_SECONDS = Histogram(
    names.GATEWAY_VIDEO_DECODE_SECONDS, "one video's decode in the pool", buckets=_SLOW
)
VIDEO_SECONDS = Counter(names.GATEWAY_VIDEO_SECONDS, "seconds of video decoded")
VIDEO_DECODES = Counter(names.GATEWAY_VIDEO_DECODES, "video decode jobs sent to the pool")
VIDEO_FRAMES_DECODED = Counter(
    names.GATEWAY_VIDEO_FRAMES_DECODED, "frames the decode pool decoded (taken or not)"
)
VIDEO_REFUSALS = Counter(
    names.GATEWAY_VIDEO_REFUSALS,
    "videos refused, by the setting that refused them",
    [names.LABEL_SETTING],
)
VIDEO_INFLIGHT_BYTES = Gauge(
    names.GATEWAY_VIDEO_INFLIGHT_BYTES, "decoded video bytes held or reserved"
)
MM_HASHES_IGNORED = Counter(
    names.GATEWAY_MM_HASHES_IGNORED,
    "callers' mm_hashes entries ignored: not the identity computed from the image's bytes",
)
BODY_PARSES = Counter(
    names.GATEWAY_BODY_PARSES,
    "request bodies parsed, on the event loop or in a parse worker process",
    [names.LABEL_WHERE],
)
POD_REQUESTS_IN_FLIGHT = Gauge(
    names.GATEWAY_POD_REQUESTS_IN_FLIGHT,
    "requests this gateway placed on the LLM pod that have not finished",
    [names.LABEL_LLM_POD],
)
POD_PREFILL_TOKENS_IN_FLIGHT = Gauge(
    names.GATEWAY_POD_PREFILL_TOKENS_IN_FLIGHT,
    "prompt tokens of this gateway's requests on the LLM pod still awaiting a first token",
    [names.LABEL_LLM_POD],
)

POD_KV_EVENT_SEQ = Gauge(
    names.GATEWAY_POD_KV_EVENT_SEQ,
    "the last KV event seq of the LLM pod that the gateway's prefix index has applied",
    [names.LABEL_LLM_POD],
)


# actual - predicted prefix tokens per routed request: negative is an over-prediction. With
# negative buckets the client exposes no _sum (OpenMetrics), only buckets and _count.
_PREDICTION_ERROR = (-4096, -1024, -256, -64, -16, -1, 0, 16, 64, 256, 1024, 4096)
ROUTING_PREFIX_ERROR_TOKENS = Histogram(
    names.GATEWAY_ROUTING_PREFIX_ERROR_TOKENS,
    "the chosen pod's cached prompt tokens at admission minus routing's prediction",
    buckets=_PREDICTION_ERROR,
)
ROUTING_OVER_PREDICTIONS = Counter(
    names.GATEWAY_ROUTING_OVER_PREDICTIONS,
    "requests whose pod held fewer prompt tokens than routing predicted (a routing miss)",
)
ROUTING_UNDER_PREDICTIONS = Counter(
    names.GATEWAY_ROUTING_UNDER_PREDICTIONS,
    "requests whose pod held more prompt tokens than routing knew of",
)
ROUTING_PREDICTED = Counter(
    names.GATEWAY_ROUTING_PREDICTED, "requests routed with a predicted prefix hit (> 0 tokens)"
)
ROUTING_PREDICTED_WITHIN_PAGE = Counter(
    names.GATEWAY_ROUTING_PREDICTED_WITHIN_PAGE,
    "requests with a predicted prefix hit whose pod's cached tokens were within one page of it",
)

# Regret per accepted request, in tokens (0: nothing lost, under reason "none").
_REGRET = (0, 16, 64, 256, 1024, 4096, 16384)
ROUTING_REQUEST_REGRET_TOKENS = Histogram(
    names.GATEWAY_ROUTING_REQUEST_REGRET_TOKENS,
    "prompt tokens the chosen pod computed that another healthy pod held, per request",
    [names.LABEL_REASON],
    buckets=_REGRET,
)
ROUTING_REGRET_TOKENS = Counter(
    names.GATEWAY_ROUTING_REGRET_TOKENS,
    "prompt tokens the chosen pods computed that another healthy pod held, by why",
    [names.LABEL_REASON],
)
ROUTING_PROMPT_TOKENS = Counter(
    names.GATEWAY_ROUTING_PROMPT_TOKENS, "prompt tokens of the requests the pods accepted"
)


def show_inflight(pod: str, requests: int, prefill_tokens: int) -> None:
    """Publish routing's count of one pod's placements (refreshed on each load poll). `pod`
    is the pod's stable name (Kubernetes' pod name, or `pod-N`), never its address."""
    POD_REQUESTS_IN_FLIGHT.labels(pod).set(requests)
    POD_PREFILL_TOKENS_IN_FLIGHT.labels(pod).set(prefill_tokens)


def forget_pod(pod: str) -> None:
    """Drop a removed pod's series (by its name)."""
    for gauge in (POD_REQUESTS_IN_FLIGHT, POD_PREFILL_TOKENS_IN_FLIGHT, POD_KV_EVENT_SEQ):
        with contextlib.suppress(KeyError):  # never shown
            gauge.remove(pod)
