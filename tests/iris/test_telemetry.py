"""Trace context crosses service boundaries: HTTP headers and gRPC metadata."""

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from iris import telemetry


def make_provider(service: str, exporter: InMemorySpanExporter) -> TracerProvider:
    from opentelemetry.sdk.resources import Resource

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def test_two_services_share_a_trace_through_http_and_grpc_propagation():
    exporter = InMemorySpanExporter()
    gateway = make_provider("gateway", exporter).get_tracer("gateway")
    llm = make_provider("llm", exporter).get_tracer("llm")
    cache = make_provider("cache", exporter).get_tracer("cache")

    with gateway.start_as_current_span("chat") as root:
        headers = telemetry.inject_headers()
        metadata = telemetry.grpc_metadata()
    assert "traceparent" in headers
    assert all(key == key.lower() for key, _ in metadata)

    with llm.start_as_current_span("generate", context=telemetry.extract_grpc_metadata(metadata)):
        inner = telemetry.grpc_metadata()
    with cache.start_as_current_span("get", context=telemetry.extract_headers(headers)):
        pass
    with cache.start_as_current_span(
        "put", context=telemetry.extract_grpc_metadata(inner + [("x-bin", b"\x00")])
    ):
        pass

    spans = {span.name: span for span in exporter.get_finished_spans()}
    trace_id = root.get_span_context().trace_id
    assert {span.context.trace_id for span in spans.values()} == {trace_id}
    assert spans["generate"].parent.span_id == root.get_span_context().span_id
    assert spans["put"].parent.span_id == spans["generate"].context.span_id
    assert {span.resource.attributes["service.name"] for span in spans.values()} == {
        "gateway",
        "llm",
        "cache",
    }


def test_no_context_gives_a_fresh_trace():
    exporter = InMemorySpanExporter()
    tracer = make_provider("x", exporter).get_tracer("x")
    with tracer.start_as_current_span("a", context=telemetry.extract_headers({})):
        pass
    span = exporter.get_finished_spans()[0]
    assert span.parent is None
    assert trace.INVALID_SPAN_CONTEXT.trace_id != span.context.trace_id
