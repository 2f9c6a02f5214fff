"""A small OTLP/gRPC trace receiver, built from opentelemetry-proto's service stubs (no
collector binary runs here). The platform's services export to it over loopback with the
real OTLP exporter (`UpConfig.otlp_endpoint`); the tests and the workload benchmark read
back the spans it received."""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int = 0
    end_ns: int = 0
    # (name, time in ns since the epoch) of each event the span recorded, in order.
    events: tuple[tuple[str, int], ...] = ()

    def event_ns(self, name: str) -> int | None:
        """When the span first recorded event `name` (None: never)."""
        return next((at for event, at in self.events if event == name), None)


def _service_name(resource_spans) -> str:
    return next(
        (
            attribute.value.string_value
            for attribute in resource_spans.resource.attributes
            if attribute.key == "service.name"
        ),
        "",
    )


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 (gRPC method name)
        received = []
        for resource_spans in request.resource_spans:
            service = _service_name(resource_spans)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service,
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                            tuple((event.name, event.time_unix_nano) for event in span.events),
                        )
                    )
        with self.lock:
            self.spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()


class SpanReceiver:
    """Listens on a free loopback port; `endpoint` is what OTEL_EXPORTER_OTLP_ENDPOINT takes.
    Use as a context manager, or call start() / stop()."""

    def __init__(self) -> None:
        self.receiver = _Receiver()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self.receiver, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)

    def __enter__(self) -> SpanReceiver:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def spans(self) -> list[ReceivedSpan]:
        with self.receiver.lock:
            return list(self.receiver.spans)

    def clear(self) -> None:
        """Forget what was received so far."""
        with self.receiver.lock:
            self.receiver.spans.clear()

    def traces(self) -> dict[str, list[ReceivedSpan]]:
        grouped: dict[str, list[ReceivedSpan]] = {}
        for span in self.spans():
            grouped.setdefault(span.trace_id, []).append(span)
        return grouped
