"""The LLM gRPC servicer (llm_svc/proto/llm.proto): thin — it parses requests, hands them
to the engine thread, and turns the events that come back into stream messages.

Generate: refusals before acceptance are status codes (errors.status_of); then `accepted`,
token chunks, `finished`. A client that leaves (or Abort) aborts the request in the engine,
which frees its pages.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from iris.telemetry import extract_grpc_metadata, extract_headers
from llm_svc.proto import llm_pb2, llm_pb2_grpc
from llm_svc.server import convert
from llm_svc.server.errors import QueueFullError, RequestError, retry_after_ms, status_of
from llm_svc.server.events import Admitted, Produced, Rejected, Submission
from llm_svc.server.kv_events import KVEventLog
from llm_svc.server.streams import RequestStream, StreamRegistry
from llm_svc.server.worker import EngineWorker

KV_BATCH_RECORDS = 512  # records per KVEventBatch message


@dataclass(frozen=True)
class ServingLimits:
    """What Generate checks before handing a request to the engine."""

    fingerprint: bytes
    max_model_len: int
    max_waiting: int
    retry_after_ms: int


class KVNotifier:
    """Wakes StreamKVEvents subscribers when records are published (loop-thread only)."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()

    def current(self) -> asyncio.Event:
        """The event that the next publish sets (take it before reading the log)."""
        return self._changed

    def published(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


@dataclass(eq=False)
class LLMServicer(llm_pb2_grpc.LLMServicer):
    """Generate, Abort, GetModelInfo, GetLoad and the KV event streams of one pod."""

    worker: EngineWorker
    streams: StreamRegistry
    kv_log: KVEventLog
    kv_notifier: KVNotifier
    model_info: llm_pb2.ModelInfo
    limits: ServingLimits
    tokenizer: Any
    tracer: trace.Tracer
    test_hooks: bool = False  # IRIS_TEST_HOOKS=1: a silent ResetPrefixCache is allowed

    def __post_init__(self) -> None:
        # One token's text, for logprobs: the same few thousand tokens recur.
        self._token_text = functools.lru_cache(maxsize=65536)(
            lambda token: self.tokenizer.decode([token])
        )

    # --- Generate ----------------------------------------------------------------------
    async def Generate(
        self, request: llm_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[llm_pb2.GenerateResponse]:
        # Not made current: the generator is resumed across awaits, and nothing nests in it.
        span = self.tracer.start_span(
            "llm.Generate", _trace_parent(request, context), kind=SpanKind.SERVER
        )
        try:
            try:
                submission = self._submission(request)
                if self.streams.waiting >= self.limits.max_waiting:
                    raise QueueFullError(
                        self.streams.waiting, self.limits.max_waiting, self.limits.retry_after_ms
                    )
                stream = self.streams.open(submission.request_id)
            except RequestError as err:
                await _refuse(context, span, err)
            submission.context = _context_with(span)
            span.set_attribute("iris.request_id", submission.request_id)
            span.set_attribute("iris.prompt_tokens", len(submission.prompt_token_ids))
            self.worker.submit(submission)
            try:
                async for response in self._responses(stream, submission, span, context):
                    yield response
            finally:
                self.streams.close(stream)
                if not stream.finished:  # the client left, or the stream failed
                    self.worker.abort(stream.request_id)
        finally:
            span.end()

    def _submission(self, request: llm_pb2.GenerateRequest) -> Submission:
        fingerprint = self.limits.fingerprint
        if request.fingerprint and request.fingerprint != fingerprint:
            raise RequestError(
                f"fingerprint {request.fingerprint.hex()[:16]}… is invalid: this pod serves "
                f"{fingerprint.hex()[:16]}… (another model or processor config)"
            )
        ids = list(request.input_ids)
        items = convert.multimodal_items(request.items, len(ids))
        params = convert.sampling_params(request.sampling, len(ids), self.limits.max_model_len)
        salt = convert.cache_salt(request.cache_salt)
        return Submission(request.request_id or uuid.uuid4().hex, ids, params, items, salt)

    async def _responses(
        self,
        stream: RequestStream,
        submission: Submission,
        span: trace.Span,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[llm_pb2.GenerateResponse]:
        completion_tokens = 0
        while True:
            event = await stream.next()
            if isinstance(event, Rejected):
                await _refuse(context, span, event.error)
            elif isinstance(event, Admitted):
                if event.step_started_ns:  # the step that ran its first prefill chunk began
                    span.add_event("prefill_started", timestamp=event.step_started_ns)
                span.add_event("accepted", {"iris.cached_tokens": event.cached_tokens})
                yield convert.accepted(event.prompt_tokens, event.cached_tokens, event.image_tokens)
            elif isinstance(event, Produced):
                out = event.output
                if out.new_token_ids or out.new_text:
                    if not completion_tokens:  # the end of prefill, as the stream sees it
                        span.add_event("first_token")
                    completion_tokens += len(out.new_token_ids)
                    yield convert.token_chunk(
                        out.new_token_ids, out.new_text, out.new_logprobs, self._token_text
                    )
                if out.finished:
                    stream.finished = True
                    usage = llm_pb2.Usage(
                        prompt_tokens=out.num_prompt_tokens,
                        completion_tokens=completion_tokens,
                        cached_tokens=out.num_cached_tokens,
                        image_tokens=submission.image_tokens,
                    )
                    span.set_attribute("iris.completion_tokens", completion_tokens)
                    span.set_attribute("iris.finish_reason", out.finish_reason or "")
                    yield convert.finished(out.finish_reason or "abort", usage)
                    return

    # --- unary calls -------------------------------------------------------------------
    async def Abort(self, request: llm_pb2.AbortRequest, context) -> llm_pb2.AbortResponse:
        found = request.request_id in self.streams
        if found:
            self.worker.abort(request.request_id)
        return llm_pb2.AbortResponse(found=found)

    async def GetModelInfo(self, request, context) -> llm_pb2.ModelInfo:
        return self.model_info

    async def GetLoad(self, request, context) -> llm_pb2.Load:
        stats = self.worker.stats
        rates = stats.rates
        return llm_pb2.Load(
            kv_utilisation=stats.kv_utilisation,
            running=stats.running,
            waiting=max(stats.waiting, self.streams.waiting),
            pending_prefill_tokens=stats.pending_prefill_tokens,
            prefill_tokens_per_s=rates.prefill_tokens_per_s,
            host_load_bytes_per_s=rates.host_load_bytes_per_s,
            store_fetch_bytes_per_s=rates.store_fetch_bytes_per_s,
            kv_bytes_per_token=rates.kv_bytes_per_token,
            kv_store=rates.kv_store,
        )

    async def ResetPrefixCache(
        self, request: llm_pb2.ResetPrefixCacheRequest, context
    ) -> llm_pb2.ResetPrefixCacheResponse:
        """Admin: drop the cached prefix pages no request holds (between engine steps)."""
        if request.silent and not self.test_hooks:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "silent=true is a test hook: the pod must run with IRIS_TEST_HOOKS=1",
            )
        announce = not request.silent
        # Published before the answer: a caller that sees it finds the REMOVED events in
        # the log, as one that sees a request finish finds what its steps stored.
        freed = await asyncio.wrap_future(
            self.worker.call(lambda engine: engine.reset_prefix_cache(announce), publish_kv=True)
        )
        return llm_pb2.ResetPrefixCacheResponse(pages_freed=freed)

    # --- KV events ---------------------------------------------------------------------
    async def GetKVSnapshot(self, request, context) -> llm_pb2.KVSnapshot:
        held = self.kv_log.snapshot()
        return llm_pb2.KVSnapshot(
            seq=held.seq, block_hashes=held.hashes, snapshot_hashes=held.snapshots,
            windowless_hashes=held.windowless, host_hashes=held.host,
        )  # fmt: skip

    async def StreamKVEvents(
        self, request: llm_pb2.KVEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[llm_pb2.KVEventBatch]:
        since = request.since_seq
        if since > self.kv_log.seq:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"since_seq={since} is invalid: the pod's last event is {self.kv_log.seq} "
                "(a restarted pod?); resync from GetKVSnapshot",
            )
        while True:
            changed = self.kv_notifier.current()
            records = self.kv_log.since(since, limit=KV_BATCH_RECORDS)
            if not records:
                await changed.wait()
                continue
            since = records[-1].seq
            yield llm_pb2.KVEventBatch(events=[_kv_event(record) for record in records])


def _kv_event(record) -> llm_pb2.KVEvent:
    if record.tier == "host":
        kind = llm_pb2.KVEvent.HOST_STORED if record.stored else llm_pb2.KVEvent.HOST_REMOVED
    elif record.tier == "store":
        kind = llm_pb2.KVEvent.STORE_STORED
    elif record.snapshot:
        kind = llm_pb2.KVEvent.SNAPSHOT_STORED
    elif record.window_removed:
        kind = llm_pb2.KVEvent.WINDOW_REMOVED
    else:
        kind = llm_pb2.KVEvent.STORED if record.stored else llm_pb2.KVEvent.REMOVED
    return llm_pb2.KVEvent(
        seq=record.seq,
        kind=kind,
        block_hashes=list(record.block_hashes),
        parent_hash=record.parent_hash,
    )


async def _refuse(context: grpc.aio.ServicerContext, span: trace.Span, error: BaseException):
    """End the call with the error's status (and retry hint); never returns."""
    code, details = status_of(error)
    span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details}"))
    hint = retry_after_ms(error)
    trailing = (("retry-after-ms", str(hint)),) if hint is not None else ()
    await context.abort(code, details, trailing_metadata=trailing)


def _trace_parent(request: llm_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
    """The caller's trace: from gRPC metadata, else from the request's TraceContext field."""
    parent = extract_grpc_metadata(context.invocation_metadata())
    if trace.get_current_span(parent).get_span_context().is_valid:
        return parent
    if request.trace.traceparent:
        headers = {"traceparent": request.trace.traceparent}
        if request.trace.tracestate:
            headers["tracestate"] = request.trace.tracestate
        return extract_headers(headers)
    return parent


def _context_with(span: trace.Span) -> contextvars.Context:
    """A copy of the current context with `span` current in it (for the engine's threads)."""
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        return contextvars.copy_context()
    finally:
        otel_context.detach(token)
