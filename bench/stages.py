"""Where a request's time goes, from its OpenTelemetry spans (every hop of a request is one
trace; the platform exports them to an `iris.up.span_receiver.SpanReceiver`).

Stages of one streamed chat request, in the order it meets them (all in ms):

  door            the HTTP server span's start to the inference span's (`chat <model>`):
                  body read, parse, validation, the output plan
  intake+hash     `gateway.intake`: the prompt built, images decoded and hashed
  routing         `gateway.route`: the router's pick
  cache reserve   `cache.reserve` in the gateway: who encodes which image
  encoder wait    what a request waited for the vision tower: `gateway.encode` (no reuse:
                  the gateway encodes before the Generate) plus the pod's
                  `llm.embeddings.fetch` less its cache reads (reuse: the pod waits on
                  the cache until an encoder fills the entry)
  cache reads     the `cache.get` calls of the trace, as the cache service timed them
  pod queue       `llm.Generate` start to its `prefill_started` event (the start of the
                  engine step that first ran it), less the fetch: waiting for a place in
                  a step, before and after the embeddings arrive
  prefill         `prefill_started` to the pod's `first_token` event
  first token     the pod's `first_token` to the gateway's (the way back to the client)
  TTFT in platform  the HTTP server span's start to the gateway's `first_token`

A stage a request did not go through (no image to encode, a hit with no fetch) counts 0.
The clocks are one machine's (every process on loopback), so times across services compare.
"""

from __future__ import annotations

from collections.abc import Iterable

from iris.up.span_receiver import ReceivedSpan

STAGES = (
    "door",
    "intake+hash",
    "routing",
    "cache reserve",
    "encoder wait",
    "cache reads",
    "pod queue",
    "prefill",
    "first token",
    "TTFT in platform",
)
_HTTP_SPAN = "POST /v1/chat/completions"


def _ms(ns: int) -> float:
    return max(ns, 0) / 1e6


def _total(spans: Iterable[ReceivedSpan]) -> int:
    return sum(span.end_ns - span.start_ns for span in spans)


def request_stages(spans: list[ReceivedSpan]) -> dict[str, float] | None:
    """One trace's stages (ms), or None when it is not a chat request that streamed a
    first token (a warm-up's trace is one; a failed request's is not)."""
    inference = next(
        (
            s
            for s in spans
            if s.service == "iris-gateway"
            and s.name.startswith("chat ")
            and s.event_ns("first_token")
        ),
        None,
    )
    generate = next(
        (s for s in spans if s.name == "llm.Generate" and s.event_ns("first_token")), None
    )
    if inference is None or generate is None:
        return None
    http = next((s for s in spans if s.name == _HTTP_SPAN), None)
    door_start = http.start_ns if http is not None else inference.start_ns

    def named(name: str) -> list[ReceivedSpan]:
        return [s for s in spans if s.name == name]

    fetches = [s for s in named("llm.embeddings.fetch") if s.parent_span_id == generate.span_id]
    reads = _total(named("cache.get"))
    # The pod's prefill began with the step that first ran it (its `accepted` event goes
    # out once that step has ended).
    accepted = (
        generate.event_ns("prefill_started") or generate.event_ns("accepted") or generate.start_ns
    )
    pod_first = generate.event_ns("first_token")
    gateway_first = inference.event_ns("first_token")
    return {
        "door": _ms(inference.start_ns - door_start),
        "intake+hash": _ms(_total(named("gateway.intake"))),
        "routing": _ms(_total(named("gateway.route"))),
        "cache reserve": _ms(_total(named("cache.reserve"))),
        "encoder wait": _ms(_total(named("gateway.encode")) + _total(fetches) - reads),
        "cache reads": _ms(reads),
        "pod queue": _ms(accepted - generate.start_ns - _total(fetches)),
        "prefill": _ms(pod_first - accepted),
        "first token": _ms(gateway_first - pod_first),
        "TTFT in platform": _ms(gateway_first - door_start),
    }


def stages_of(traces: dict[str, list[ReceivedSpan]], since_ns: int = 0) -> list[dict]:
    """The stages of every chat request whose inference span started at or after
    `since_ns` (the measured turns, not the warm-up before them)."""
    found = []
    for spans in traces.values():
        starts = [s.start_ns for s in spans if s.name.startswith("chat ")]
        if starts and min(starts) >= since_ns:
            stages = request_stages(spans)
            if stages is not None:
                found.append(stages)
    return found


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summarise_stages(requests: list[dict]) -> dict[str, tuple[float, float]]:
    """Per stage, (median, p90) in ms over `requests` (empty: no request had its spans)."""
    if not requests:
        return {}
    return {
        stage: (
            _percentile([r[stage] for r in requests], 50),
            _percentile([r[stage] for r in requests], 90),
        )
        for stage in STAGES
    }


def format_stages(summary: dict[str, tuple[float, float]], requests: int) -> str:
    """The table each mode's output ends with."""
    if not summary:
        return "  time per stage: no request's spans arrived"
    lines = [f"  time per stage, ms (median / p90 over {requests} requests' spans):"]
    for stage, (median, p90) in summary.items():
        lines.append(f"    {stage:<17} {median:9.1f} / {p90:9.1f}")
    return "\n".join(lines)
