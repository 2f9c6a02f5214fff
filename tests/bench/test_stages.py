"""Time per stage from a request's spans (bench/stages.py), on a trace built by hand with the
span names and events the services record."""

from dataclasses import replace

from bench.stages import STAGES, format_stages, request_stages, stages_of, summarise_stages
from iris.up.span_receiver import ReceivedSpan

MS = 1_000_000


def span(name, start_ms, end_ms, span_id, parent="", service="iris-gateway", events=()):
    return ReceivedSpan(
        service, name, "t1", span_id, parent, start_ms * MS, end_ms * MS,
        tuple((event, at_ms * MS) for event, at_ms in events),
    )  # fmt: skip


def chat_trace(offset=0):
    """door 5, intake 10, routing 2, reserve 3, gateway encode 0; pod: fetch 40 with 15 of
    cache reads, its prefill step starting 60 after its start (accepted when that step
    ended), first token 30 later; back at the gateway 4 after that."""
    o = offset
    return [
        span("POST /v1/chat/completions", o + 0, o + 200, "h"),
        span("chat demo", o + 5, o + 190, "c", "h", events=[("first_token", o + 129)]),
        span("gateway.intake", o + 6, o + 16, "i", "c"),
        span("gateway.route", o + 17, o + 19, "r", "c"),
        span("cache.reserve", o + 20, o + 23, "v", "c"),
        span(
            "llm.Generate",
            o + 35,
            o + 180,
            "g",
            "c",
            "iris-llm",
            events=[("prefill_started", o + 95), ("accepted", o + 124), ("first_token", o + 125)],
        ),  # fmt: skip
        span("llm.embeddings.fetch", o + 40, o + 80, "f", "g", "iris-llm"),
        span("cache.get", o + 42, o + 50, "x", "f", "iris-cache"),
        span("cache.get", o + 70, o + 77, "y", "f", "iris-cache"),
        span("encoder.Encode", o + 24, o + 60, "e", "c", "iris-encoder"),
    ]


def test_each_stage_from_the_spans():
    stages = request_stages(chat_trace())
    assert stages == {
        "door": 5.0,
        "intake+hash": 10.0,
        "routing": 2.0,
        "cache reserve": 3.0,
        "encoder wait": 25.0,  # the fetch's 40 less its 15 of reads
        "cache reads": 15.0,
        "pod queue": 20.0,  # 60 to acceptance less the 40 fetching
        "prefill": 30.0,
        "first token": 4.0,
        "TTFT in platform": 129.0,
    }
    assert list(stages) == list(STAGES)


def test_without_the_prefill_start_acceptance_stands_for_it():
    spans = chat_trace()
    generate = next(s for s in spans if s.name == "llm.Generate")
    spans[spans.index(generate)] = replace(generate, events=generate.events[1:])
    stages = request_stages(spans)
    assert stages["pod queue"] == 49.0 and stages["prefill"] == 1.0


def test_no_reuse_waits_for_the_encoder_in_the_gateway():
    spans = [s for s in chat_trace() if s.name not in ("llm.embeddings.fetch", "cache.get")]
    spans.append(span("gateway.encode", 24, 33, "n", "c"))
    stages = request_stages(spans)
    assert stages["encoder wait"] == 9.0 and stages["cache reads"] == 0.0
    assert stages["pod queue"] == 60.0


def test_traces_without_a_streamed_first_token_or_before_the_start_are_left_out():
    failed = [s for s in chat_trace() if s.name != "llm.Generate"]
    assert request_stages(failed) is None
    traces = {"early": chat_trace(0), "late": chat_trace(1000), "failed": failed}
    assert len(stages_of(traces, since_ns=500 * MS)) == 1
    assert len(stages_of(traces)) == 2


def test_median_and_p90_per_stage_and_the_printed_table():
    requests = [request_stages(chat_trace())] * 3
    requests.append({**requests[0], "prefill": 300.0})
    summary = summarise_stages(requests)
    assert summary["prefill"] == (30.0, 300.0)
    text = format_stages(summary, len(requests))
    assert "over 4 requests" in text and "prefill" in text
    assert "no request's spans" in format_stages(summarise_stages([]), 0)
