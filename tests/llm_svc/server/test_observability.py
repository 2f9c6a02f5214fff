"""What the pod tells the outside: model info, load, health, /metrics, and trace spans
that continue the caller's trace."""

from __future__ import annotations

import json

import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client.parser import text_string_to_metric_families

from iris import metrics as names
from iris.multimodal import processor_fingerprint
from iris.proto import common_pb2
from iris.telemetry import grpc_metadata
from llm_svc.proto import llm_pb2
from tests.llm_svc.server.pods import request

LLM_METRICS = [
    names.LLM_KV_UTILISATION,
    names.LLM_KV_SEQUENCE_CAPACITY,
    names.LLM_REQUESTS_RUNNING,
    names.LLM_REQUESTS_WAITING,
    names.LLM_PENDING_PREFILL_TOKENS,
    names.LLM_PREFIX_HIT_RATE,
    names.LLM_PREFIX_HIT_TOKENS,
    names.LLM_PROMPT_TOKENS,
    names.LLM_GENERATION_TOKENS,
    names.LLM_IMAGE_TOKENS,
    names.LLM_TTFT_SECONDS,
    names.LLM_TPOT_SECONDS,
    names.LLM_TOKENS_PER_SECOND,
    names.LLM_REQUESTS_FINISHED,
    names.LLM_PREEMPTIONS,
    names.LLM_GRAMMAR_COMPILES,
    names.LLM_GRAMMAR_COMPILE_TIMEOUTS,
    # The host KV tier's, at 0 on a pod without one (the dashboard panel has data).
    names.LLM_KV_TIER_PAGES,
    names.LLM_KV_TIER_HITS,
    names.LLM_KV_TIER_MISSES,
    names.LLM_KV_TIER_BYTES,
    names.LLM_KV_TIER_LOAD_FAILURES,
    names.LLM_KV_TIER_DROPPED,
    names.LLM_KV_TIER_LOAD_SECONDS,
    names.LLM_KV_TIER_FILL_RATIO,
    names.LLM_KV_TIER_CAPACITY_BYTES,
    names.LLM_KV_TIER_HOST_HIT_TOKENS,
    # The shared KV store's, at 0 on a pod without one (configured 0).
    names.LLM_KV_STORE_CONFIGURED,
    names.LLM_KV_STORE_UP,
    names.LLM_KV_STORE_HITS,
    names.LLM_KV_STORE_MISSES,
    names.LLM_KV_STORE_BYTES,
    names.LLM_KV_STORE_FETCH_SECONDS,
    names.LLM_KV_STORE_CHECKSUM_FAILURES,
    names.LLM_KV_STORE_DROPPED_WRITES,
    names.LLM_KV_STORE_SKIPPED_WRITES,
    names.LLM_KV_STORE_ERRORS,
]


def scrape(pod) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{pod.server.metrics_port}/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


async def test_model_info_describes_the_checkpoint(stub, tiny_idefics3_dir):
    info = await stub.GetModelInfo(llm_pb2.ModelInfoRequest())
    assert info.fingerprint == processor_fingerprint(tiny_idefics3_dir)
    assert info.model_id == tiny_idefics3_dir.name
    assert (info.page_size, info.vocab_size, info.max_model_len) == (4, 448, 4096)
    assert "message" in info.chat_template
    assert info.pod_name == "pod-test"
    # Every layer of the tiny model attends fully: what the gateway's resume rule needs.
    config = json.loads((tiny_idefics3_dir / "config.json").read_text())
    layers = (config.get("text_config") or config)["num_hidden_layers"]
    assert [layer.kind for layer in info.layers] == [llm_pb2.AttentionLayer.FULL] * layers


async def test_metrics_count_a_request(stub, pod):
    before = scrape(pod)
    prompt = [(5 * i) % 200 + 40 for i in range(21)]
    async for _ in stub.Generate(request("metrics-0", prompt, 6)):
        pass
    after = scrape(pod)
    for name in LLM_METRICS:
        assert any(sample.startswith(name) for sample in after), f"{name} not exported"

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert grew(names.LLM_PROMPT_TOKENS) == 21
    assert grew(names.LLM_GENERATION_TOKENS) == 6
    assert grew(names.LLM_REQUESTS_FINISHED) == 1
    assert grew(f"{names.LLM_TTFT_SECONDS}_count") == 1
    assert grew(f"{names.LLM_TPOT_SECONDS}_count") == 1
    assert after[names.LLM_TOKENS_PER_SECOND] > 0  # tokens within the last window
    assert after[names.LLM_REQUESTS_RUNNING] == 0
    assert after[names.LLM_KV_UTILISATION] == 0  # cached pages are free to evict
    assert 0 <= after[names.LLM_PREFIX_HIT_RATE] <= 1


async def test_load_and_health(stub, channel, pod):
    load = await stub.GetLoad(llm_pb2.LoadRequest())
    assert (load.running, load.waiting, load.kv_utilisation) == (0, 0, 0.0)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "iris.llm.LLM"):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    response = httpx.get(f"http://127.0.0.1:{pod.server.metrics_port}/healthz")
    assert response.status_code == 200 and response.json()["ok"] is True
    assert httpx.get(f"http://127.0.0.1:{pod.server.metrics_port}/nope").status_code == 404


async def test_the_generate_span_continues_the_callers_trace(stub, pod):
    caller = TracerProvider().get_tracer("test-caller")
    with caller.start_as_current_span("gateway.request") as parent:
        metadata = grpc_metadata()
        async for _ in stub.Generate(request("traced-0", [30, 31, 32], 2), metadata=metadata):
            pass
    spans = [s for s in pod.spans.get_finished_spans() if s.name == "llm.Generate"]
    span = next(s for s in spans if s.attributes.get("iris.request_id") == "traced-0")
    assert span.context.trace_id == parent.get_span_context().trace_id
    assert span.parent.span_id == parent.get_span_context().span_id
    assert span.attributes["iris.completion_tokens"] == 2


async def test_the_trace_field_is_used_when_metadata_has_none(stub, pod):
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    message = request("traced-1", [30, 31, 33], 2)
    message.trace.CopyFrom(common_pb2.TraceContext(traceparent=f"00-{trace_id}-{span_id}-01"))
    async for _ in stub.Generate(message):
        pass
    spans = [s for s in pod.spans.get_finished_spans() if s.name == "llm.Generate"]
    span = next(s for s in spans if s.attributes.get("iris.request_id") == "traced-1")
    assert f"{span.context.trace_id:032x}" == trace_id
    assert f"{span.parent.span_id:016x}" == span_id
