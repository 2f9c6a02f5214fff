"""OpenTelemetry setup and W3C trace-context propagation over HTTP headers and gRPC metadata.

`setup_tracing(service_name)` installs a tracer provider once per process: with an OTLP
gRPC exporter when an endpoint is given (or OTEL_EXPORTER_OTLP_ENDPOINT is set), with no
exporter otherwise (spans are still created, so trace ids still propagate).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, MutableMapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

_provider: TracerProvider | None = None


def setup_tracing(
    service_name: str,
    endpoint: str | None = None,
    extra_processors: Sequence[SpanProcessor] = (),
) -> TracerProvider:
    """Install (once) and return this process's tracer provider."""
    global _provider
    if _provider is not None:
        for processor in extra_processors:
            _provider.add_span_processor(processor)
        return _provider
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    endpoint = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = not endpoint.startswith("https://")
        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=insecure)
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    for processor in extra_processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def shutdown_tracing() -> None:
    """Flush and stop the exporters (call at process exit)."""
    if _provider is not None:
        _provider.force_flush(timeout_millis=2000)
        _provider.shutdown()


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


# --- HTTP headers ----------------------------------------------------------------------


def inject_headers(headers: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """Write the current trace context (traceparent, tracestate) into `headers`."""
    headers = {} if headers is None else headers
    propagate.inject(headers)
    return headers


def extract_headers(headers: Mapping[str, str]) -> otel_context.Context:
    """The context a server span should be started under, from incoming HTTP headers."""
    return propagate.extract({key.lower(): value for key, value in headers.items()})


# --- gRPC metadata ---------------------------------------------------------------------


def grpc_metadata() -> list[tuple[str, str]]:
    """The current trace context as gRPC metadata (keys are lower-case, as gRPC requires)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(key.lower(), value) for key, value in carrier.items()]


def extract_grpc_metadata(
    metadata: Iterable[tuple[str, str | bytes]] | None,
) -> otel_context.Context:
    """The context a gRPC server span should be started under, from invocation metadata."""
    carrier = {}
    for key, value in metadata or ():
        if isinstance(value, bytes):  # binary (-bin) metadata never carries trace context
            continue
        carrier[key.lower()] = value
    return propagate.extract(carrier)
