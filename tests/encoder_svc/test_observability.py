"""/metrics and /healthz over HTTP, gRPC health, and spans under the caller's trace."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from encoder_svc.metrics import STAGES
from encoder_svc.server import SERVICE_NAME
from iris import metrics as names
from tests.encoder_svc.stack import encode_item, png

ENCODER_NAMES = [
    names.ENCODER_QUEUED_IMAGES,
    names.ENCODER_QUEUED_VISION_TOKENS,
    names.ENCODER_BUSY_RATIO,
    names.ENCODER_BATCH_SIZE + "_bucket",
    names.ENCODER_DEDUP_RATIO,
    names.ENCODER_IMAGES,
    names.ENCODER_VISION_TOKENS,
    names.ENCODER_IMAGES_PER_SECOND,
    names.ENCODER_VISION_TOKENS_PER_SECOND,
    names.ENCODER_REJECTED,
]


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_metrics_health_and_grpc_health(qwen, stack_factory):
    stack = await stack_factory(qwen, max_wait_ms=1)
    item = encode_item(qwen, png(71, 200, 120))
    await stack.encode([item, item])
    base = f"http://127.0.0.1:{stack.encoder.metrics_port}"
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{base}/metrics")).text
        health = await http.get(f"{base}/healthz")
    for name in ENCODER_NAMES:
        assert f"\n{name}" in text, name
    assert _value(text, names.ENCODER_IMAGES) == 1
    assert _value(text, names.ENCODER_VISION_TOKENS) == item.item.token_count
    assert _value(text, names.ENCODER_DEDUP_RATIO) == 0.5
    assert _value(text, names.ENCODER_IMAGES_PER_SECOND) > 0
    assert _value(text, names.ENCODER_BUSY_RATIO) > 0
    assert _value(text, names.ENCODER_QUEUED_IMAGES) == 0
    # The one encoded image passed each stage once (the duplicate joined it at admission).
    for stage in STAGES:
        count = f'{names.ENCODER_STAGE_SECONDS}_count{{{names.LABEL_STAGE}="{stage}"}}'
        assert _value(text, count) == 1, stage
    assert health.status_code == 200

    checker = health_pb2_grpc.HealthStub(stack.channel)
    for service in ("", SERVICE_NAME):
        reply = await checker.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_draining_encoder_is_not_ready_but_live_and_finishes_its_work(qwen, stack_factory):
    stack = await stack_factory(qwen, max_wait_ms=1)
    stack.runner.gate.clear()
    pending = asyncio.ensure_future(stack.encode([encode_item(qwen, png(73, 96, 96))]))
    while not stack.runner.entered.is_set():
        await asyncio.sleep(0.01)
    stopping = asyncio.ensure_future(stack.encoder.stop(grace_s=60))
    stack.stopped = True
    await asyncio.sleep(0)
    checker = health_pb2_grpc.HealthStub(stack.channel)
    reply = await checker.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    base = f"http://127.0.0.1:{stack.encoder.metrics_port}"
    async with httpx.AsyncClient() as http:
        live = await http.get(f"{base}/healthz")
    # Liveness stays: the process is well and finishing its work (a kubelet must not kill it).
    assert live.status_code == 200 and live.json()["serving"] is False, live.text
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.encode([encode_item(qwen, png(74, 96, 96))])
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    stack.runner.gate.set()
    reply = await pending
    assert reply.results[0].ok  # admitted work finished within the grace period
    await stopping


async def test_spans_join_the_callers_trace(qwen, stack_factory):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    stack = await stack_factory(qwen, tracer_provider=provider, max_wait_ms=1)
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    metadata = (("traceparent", f"00-{trace_id}-{parent_id}-01"),)
    await stack.encode([encode_item(qwen, png(72, 96, 96))], metadata=metadata)

    spans = {span.name: span for span in exporter.get_finished_spans()}
    served = spans["encoder.Encode"]
    assert served.context.trace_id == int(trace_id, 16)
    assert served.parent.span_id == int(parent_id, 16)
    batch = spans["encoder.batch"]
    assert [link.context.span_id for link in batch.links] == [served.context.span_id]
    assert batch.attributes["encoder.images"] == 1
