"""The gRPC servicer: validate, admit, wait for the shared work, answer per item."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from opentelemetry import trace

from encoder_svc.batcher import Batcher
from encoder_svc.jobs import QueueFull, ShuttingDown
from encoder_svc.proto import encoder_pb2, encoder_pb2_grpc
from encoder_svc.validate import InvalidRequest, RequestLimits, WrongModel, jobs_from_request
from iris.telemetry import extract_grpc_metadata

RETRY_AFTER_KEY = "retry-after-ms"


@dataclass(eq=False)
class EncoderServicer(encoder_pb2_grpc.EncoderServicer):
    """`Encode` returns when every item is stored (embedding or failed entry).

    Malformed requests → INVALID_ARGUMENT, another model's fingerprint →
    FAILED_PRECONDITION, a full queue → RESOURCE_EXHAUSTED with `retry-after-ms` in the
    trailing metadata, a stopping encoder → UNAVAILABLE. Per-image failures are not RPC
    errors: they come back as results with ok=false (and are in the cache as failed).
    """

    batcher: Batcher
    fingerprint: bytes
    limits: RequestLimits
    tracer: trace.Tracer

    async def Encode(  # noqa: N802 - gRPC method name
        self, request: encoder_pb2.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> encoder_pb2.EncodeResponse:
        parent = extract_grpc_metadata(context.invocation_metadata())
        with self.tracer.start_as_current_span(
            "encoder.Encode", context=parent, kind=trace.SpanKind.SERVER
        ) as span:
            span.set_attribute("encoder.items", len(request.items))
            try:
                jobs = jobs_from_request(request, self.fingerprint, self.limits)
            except InvalidRequest as err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            except WrongModel as err:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
            try:
                outcomes = await self.batcher.encode(jobs)
            except QueueFull as err:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    str(err),
                    trailing_metadata=((RETRY_AFTER_KEY, str(err.retry_after_ms)),),
                )
            except ShuttingDown as err:
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
            failed = sum(not outcome.ok for outcome in outcomes)
            span.set_attribute("encoder.failed_items", failed)
            results = [
                encoder_pb2.EncodeResult(
                    key=outcome.key,
                    ok=outcome.ok,
                    error=outcome.error,
                    retryable=outcome.retryable,
                )
                for outcome in outcomes
            ]
            return encoder_pb2.EncodeResponse(results=results)
