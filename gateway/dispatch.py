"""From a prepared prompt to an accepted generation on one pod (docs/design/gateway.md).

Route; Reserve in the cache the images the chosen pod's prefix does not cover; send Encode
for the RESERVED ones without awaiting it; call Generate and wait for `accepted`. Before
acceptance: "embedding missing" → reserve + encode every image and retry once; a pod that
is unavailable or full → the next pod; a pod that cannot reach the cache → 503 at once
(every pod shares it); an encoder that is full or unavailable → the next encoder; every
encoder full → 429 with their retry hint, all unavailable → 503; an embedding the cache
would not store → 503 + Retry-After; an image that failed to encode → 400. After
acceptance the caller streams the pod's chunks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field

import grpc

from encoder_svc.proto import encoder_pb2
from gateway import metrics
from gateway.clients.cache import CacheClient, ReserveStatus
from gateway.clients.channels import MAX_MESSAGE_BYTES
from gateway.clients.encoders import EncoderPool, EncodersFull, EncodersUnavailable
from gateway.errors import APIError, bad_request, upstream_failure
from gateway.intake.prompt import PreparedPrompt
from gateway.routing import accuracy, regret
from gateway.routing.inflight import Ticket
from gateway.routing.plugins.base import RoutingRequest
from gateway.routing.pods import Pod
from gateway.routing.registry import PodRegistry
from gateway.routing.router import Decision, Router
from iris.multimodal import Modality
from iris.proto import common_pb2
from iris.telemetry import grpc_metadata, inject_headers, tracer
from llm_svc.proto import llm_pb2

log = logging.getLogger(__name__)
_tracer = tracer("gateway.dispatch")

EMBEDDING_MISSING = "embedding missing"
CACHE_UNAVAILABLE = "embedding cache unavailable"  # llm_svc/server/errors.py: not the pod's fault
# Before acceptance: the pod did not take the request, so another pod may. A pod that is
# stopping cancels, in gRPC itself, a call that reaches it before its servicer takes it: a
# CANCELLED the gateway reads is the pod's (a call the gateway cancels is never read again).
_NEXT_POD = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
}
# After acceptance: the pod (not the request) failed, so another pod may serve it (a pod
# whose engine step failed says UNAVAILABLE; so does a call whose pod died; a pod stopping
# past its grace cancels the calls left).
_POD_FAILED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}


_MODALITY = {Modality.IMAGE: common_pb2.IMAGE, Modality.VIDEO: common_pb2.VIDEO}


def _kind(item) -> str:
    """How an error names an item: "an image" or "a video frame group"."""
    return "a video frame group" if item.modality == Modality.VIDEO else "an image"


def item_to_proto(item) -> common_pb2.MultimodalItem:
    return common_pb2.MultimodalItem(
        modality=_MODALITY[item.modality],
        identity=item.identity or b"",
        hash=item.hash,
        offsets=[common_pb2.Span(start=start, end=end) for start, end in item.offsets],
        token_count=item.token_count,
        grid=list(item.grid),
    )


@dataclass
class Generation:
    """An accepted generation: the pod, its `accepted` message, the rest of the stream, and
    its placement ticket (closed when the stream ends, fails or is cancelled)."""

    request_id: str
    pod: Pod
    accepted: llm_pb2.Accepted
    call: grpc.aio.UnaryStreamCall
    ticket: Ticket | None = None
    idle_s: float | None = None  # the longest the pod may send nothing (None: no limit)
    on_tokens: Callable[[int], None] | None = None  # called with each chunk's token count
    pod_failed: bool = False  # the pod failed this generation mid-stream (its call broke)
    _first: llm_pb2.GenerateResponse | None = field(default=None, init=False, repr=False)

    async def prime(self) -> None:
        """Read the first message after acceptance and keep it for `responses()`; raises
        what `responses()` would. Until it returns nothing of this choice has begun, so a
        failure here may be retried on another pod (gateway/api/generation.py). Its tokens
        are counted (`on_tokens`) now: they were computed even if this attempt is given up."""
        message = await self._read()
        if message is not grpc.aio.EOF:
            self._count(message)
            self._first = message

    async def responses(self) -> AsyncIterator[llm_pb2.GenerateResponse]:
        """Token chunks, then `finished`. A pod failure mid-stream raises APIError(503); a
        pod silent for `idle_s`, or past the call's deadline, APIError(504
        upstream_timeout) — a frozen pod ends the request, it never hangs it."""
        try:
            while True:
                if self._first is not None:
                    message, self._first = self._first, None  # counted by `prime`
                else:
                    message = await self._read()
                    if message is grpc.aio.EOF:
                        return
                    self._count(message)
                yield message
        finally:
            self._close_ticket()

    def _count(self, message: llm_pb2.GenerateResponse) -> None:
        """A message just read from the pod: its tokens to the ticket and `on_tokens`."""
        if message.HasField("tokens"):
            if self.ticket is not None:
                self.ticket.first_token()
            if self.on_tokens is not None:
                self.on_tokens(len(message.tokens.token_ids))

    async def _read(self):
        """The pod's next message (or EOF), its failures as APIErrors."""
        try:
            try:
                return await asyncio.wait_for(self.call.read(), self.idle_s)
            except TimeoutError:
                self.call.cancel()
                raise upstream_failure(
                    504,
                    f"the LLM pod sent nothing for {self.idle_s:g} s",
                    code="upstream_timeout",
                    request_id=self.request_id,
                    detail=f"pod {self.pod.address} silent after acceptance",
                ) from None
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise deadline_error(self.pod, err, self.request_id) from None
            self.pod_failed = err.code() in _POD_FAILED
            raise upstream_failure(
                503,
                "the LLM pod failed mid-stream",
                code="upstream_error",
                request_id=self.request_id,
                detail=f"pod {self.pod.address}: {err.code().name} {err.details()}",
            ) from None

    def cancel(self) -> None:
        """Stop the pod's work (the client left or another choice failed)."""
        self.call.cancel()
        self._close_ticket()

    def _close_ticket(self) -> None:
        if self.ticket is not None:
            self.ticket.close()


@dataclass(eq=False, kw_only=True)
class Dispatcher:
    """Places prepared prompts on pods and gets them accepted."""

    router: Router
    registry: PodRegistry
    cache: CacheClient
    encoders: EncoderPool
    fingerprint: bytes
    lease_ms: int
    accept_timeout_s: float
    embedding_reuse: bool = True
    max_encode_bytes: int = MAX_MESSAGE_BYTES
    # Items per Encode message (the encoder's own max_items_per_request, default 64): a
    # request with more to encode (a video's frame groups) sends several, one after another.
    max_encode_items: int = 64
    stream_idle_s: float | None = None  # after acceptance, the longest a pod may be silent
    generate_timeout_s: float | None = None  # the gRPC deadline of every Generate
    # Encode (and Abandon) calls nobody awaits, kept referenced until they end.
    _background: set[asyncio.Task] = field(default_factory=set, init=False, repr=False)
    # Numbers the tries on pods, so that every try has an id of its own on its pod.
    _tries: Iterator[int] = field(default_factory=itertools.count, init=False, repr=False)

    @property
    def background(self) -> int:
        """How many Encode / Abandon calls started by past requests are still running."""
        return len(self._background)

    async def settle(self, timeout_s: float) -> None:
        """Wait (up to `timeout_s`) for the background Encode / Abandon calls to end: a
        stopping gateway that cut them would leave leases nobody fills or gives back."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout_s)

    def route(self, prompt: PreparedPrompt, exclude: frozenset[str] = frozenset()) -> Decision:
        spans = [(first, last + 1) for item in prompt.items for first, last in item.offsets]
        request = RoutingRequest(
            prompt.input_ids, self.fingerprint, prompt.salts.prefix, prompt.uncut_spans,
            image_spans=spans,
            encode_seconds_per_token=_seconds_per(self.encoders.rate.per_second),
        )  # fmt: skip
        return self.router.route(request, self.registry.pods(), exclude)

    async def start(
        self,
        prompt: PreparedPrompt,
        sampling: common_pb2.SamplingParams,
        request_id: str,
        decision: Decision | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> Generation:
        """Route (unless given a decision; never to a pod in `exclude`), prepare
        embeddings, Generate until accepted.

        The decision's in-flight ticket passes to the Generation; the ticket of a decision
        given up (another pod is tried, or the start fails) is closed here."""
        tried: set[str] = set(exclude)
        retried_missing = False
        force_all = not self.embedding_reuse
        last_error: grpc.aio.AioRpcError | None = None
        while True:
            if decision is None:
                try:
                    decision = self.route(prompt, frozenset(tried))
                except APIError as err:
                    raise self._exhausted(err, last_error, request_id) from None
            try:
                return await self._attempt(prompt, sampling, request_id, decision, force_all)
            except grpc.aio.AioRpcError as err:
                code, details = err.code(), err.details() or ""
                if code == grpc.StatusCode.FAILED_PRECONDITION and EMBEDDING_MISSING in details:
                    if not retried_missing:
                        retried_missing, force_all = True, True
                        metrics.RETRIES.labels("embedding_missing").inc()
                        continue  # same pod: its prefix was evicted or a lease lapsed
                    decision.release()
                    raise upstream_failure(
                        503,
                        "image embeddings were missing on the LLM pod, also on retry",
                        code="embedding_missing",
                        request_id=request_id,
                        detail=f"pod {decision.pod.address}: {details}",
                    ) from None
                decision.release()
                if code in _NEXT_POD:
                    tried.add(decision.pod.address)
                    last_error = err
                    metrics.RETRIES.labels(code.name.lower()).inc()
                    log.warning("pod %s refused %s: %s", decision.pod.address, request_id, details)
                    decision = None
                    continue
                raise upstream_error(err, request_id, decision.pod.address) from None
            except BaseException:
                decision.release()
                raise

    async def _attempt(
        self,
        prompt: PreparedPrompt,
        sampling: common_pb2.SamplingParams,
        request_id: str,
        decision: Decision,
        force_all: bool,
    ) -> Generation:
        """One try on the decision's pod: embeddings it lacks, then Generate until accepted.

        The pod knows the try as `request_id` + "." + a number of its own: a pod that still
        ends an earlier try of the same choice (its cancel on the way) never mistakes it
        for this one. Errors and logs name `request_id`, the id the client knows."""
        indices = self._uncovered(prompt, 0 if force_all else decision.matched_tokens)
        encode = await self._prepare_embeddings(prompt, indices, request_id)
        attempt_id = f"{request_id}.{next(self._tries)}"
        generation = await self._generate(
            prompt, sampling, request_id, attempt_id, decision.pod, encode
        )
        generation.ticket = decision.ticket
        cached = generation.accepted.cached_tokens
        accuracy.record(decision.matched_tokens, cached, decision.pod.page_size)
        if decision.regret_basis is not None:
            regret.record(decision.regret_basis, cached, prompt.prompt_tokens)
        return generation

    def _exhausted(
        self, err: APIError, last: grpc.aio.AioRpcError | None, request_id: str
    ) -> APIError:
        if err.status == 503 and last is not None:
            if last.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return APIError(
                    429,
                    "every LLM pod is full; retry later",
                    code="overloaded",
                    retry_after=self.router.retry_after_s,
                )
            return upstream_failure(
                503,
                "no LLM pod accepted the request",
                code="no_pod_available",
                request_id=request_id,
                detail=f"{last.code().name} {last.details()}",
            )
        return err

    @staticmethod
    def _uncovered(prompt: PreparedPrompt, matched_tokens: int) -> list[int]:
        """Items with a token past the pod's cached prefix: they need their embedding."""
        return [
            i
            for i, item in enumerate(prompt.items)
            if max(end for _, end in item.offsets) >= matched_tokens
        ]

    async def _prepare_embeddings(
        self, prompt: PreparedPrompt, indices: Sequence[int], request_id: str
    ) -> asyncio.Task | None:
        """Reserve `indices`; Encode the RESERVED ones in the background; return that task."""
        metrics.EMBEDDING_HITS.inc(len(prompt.items) - len(indices))
        if not indices:
            return None
        if not self.embedding_reuse:
            # The no-reuse baseline: every request encodes all its images afresh and waits
            # for them, as a deployment without a shared embedding cache would.
            await self._encode_now(prompt, indices, request_id)
            return None
        items = [prompt.items[i] for i in indices]
        with _tracer.start_as_current_span("cache.reserve") as span:
            span.set_attribute("iris.images", len(items))
            states = await self.cache.reserve(
                [(item.key, item.token_count) for item in items], self.lease_ms, request_id
            )
        to_encode = []
        for i, (status, reason) in zip(indices, states, strict=True):
            if status is ReserveStatus.FAILED:
                item = prompt.items[i]
                code = "invalid_video" if item.modality == Modality.VIDEO else "invalid_image"
                message = f"{_kind(item)} (item {i}) cannot be used: {reason}"
                raise bad_request(message, "messages", code)
            if status is ReserveStatus.RESERVED:
                to_encode.append(i)
            elif status is ReserveStatus.PRESENT:
                metrics.EMBEDDING_HITS.inc()
        if not to_encode:
            return None
        try:
            batches = self._encode_batches(prompt, to_encode)
        except APIError:
            # Our leases would otherwise make every request for these images wait them out.
            keys = [prompt.items[i].key for i in to_encode]
            abandon = asyncio.ensure_future(self.cache.abandon(keys))
            self._background.add(abandon)
            abandon.add_done_callback(self._background.discard)
            raise
        metrics.ENCODE_DISPATCHED.inc(len(to_encode))
        # The task keeps its own list of the payloads: the request drops a video's from its
        # prompt once its choices are accepted (gateway/api/generation.py), and the frames
        # then go as soon as this encode is done.
        own = dataclasses.replace(prompt, images=list(prompt.images))
        task = asyncio.create_task(self._encode_batches_in_turn(own, batches))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        keys = [prompt.items[i].key for i in to_encode]
        task.add_done_callback(lambda done: self._abandon_if_not_encoded(done, keys))
        return task

    async def _encode_batches_in_turn(
        self, prompt: PreparedPrompt, batches: list[list[int]]
    ) -> encoder_pb2.EncodeResponse:
        """Each Encode message in turn (the pod starts on the first items while the later
        ones encode; no one request fills an encoder's queue); their results together. A
        message is built just before it is sent, on a worker thread (the payloads, a video's
        frame groups packed, are copied into it item by item, each a short hold of the GIL),
        so one message's copy of the payloads is alive at a time, never the whole request's."""
        merged = encoder_pb2.EncodeResponse()
        salt = prompt.salts.images
        for indices in batches:
            batch = await asyncio.to_thread(self._encode_message, prompt, indices)
            response = await self.encoders.encode(batch, salt, grpc_metadata())
            del batch
            merged.results.extend(response.results)
        return merged

    def _abandon_if_not_encoded(self, task: asyncio.Task, keys: list[bytes]) -> None:
        """An encode that never ran (no encoder, or the call failed other than by refusing
        the image) leaves our leases with no entry to come: abandon them, or every request
        for those images would wait out the lease before failing."""
        error = None if task.cancelled() else task.exception()
        ran = error is None or (
            isinstance(error, grpc.aio.AioRpcError)
            and error.code() == grpc.StatusCode.INVALID_ARGUMENT
        )
        if task.cancelled() or not ran:
            abandon = asyncio.ensure_future(self.cache.abandon(keys))
            self._background.add(abandon)
            abandon.add_done_callback(self._background.discard)

    def _encode_batches(self, prompt: PreparedPrompt, indices: Sequence[int]) -> list[list[int]]:
        """`indices` cut into Encode messages of at most `max_encode_items` items and
        `max_encode_bytes` bytes each; a 413 for an item that cannot go in any message
        (sending would fail on the channel's limit, which is no outage to report as 503)."""
        overhead = self._message_overhead(prompt)
        batches: list[list[int]] = [[]]
        size = overhead
        for i in indices:
            item = prompt.items[i]
            kind = _kind(item)
            # Its payload, and the tags and length prefixes of the payload and of the item
            # (at most 1 + 10 bytes each).
            item_size = item_to_proto(item).ByteSize() + len(prompt.images[i]) + 22
            if overhead + item_size > self.max_encode_bytes:
                raise APIError(
                    413,
                    f"{kind} to encode comes to {overhead + item_size} bytes in an Encode "
                    f"message, over the limit of {self.max_encode_bytes}; send a smaller one",
                    param="messages",
                    code="images_too_large",
                )
            current = batches[-1]
            if current and (
                len(current) >= self.max_encode_items or size + item_size > self.max_encode_bytes
            ):
                batches.append([])
                size = overhead
            batches[-1].append(i)
            size += item_size
        return batches

    def _message_overhead(self, prompt: PreparedPrompt) -> int:
        message = encoder_pb2.EncodeRequest(
            fingerprint=self.fingerprint, identity_salt=prompt.salts.images or b""
        )
        return message.ByteSize()

    def _encode_message(
        self, prompt: PreparedPrompt, indices: Sequence[int]
    ) -> encoder_pb2.EncodeRequest:
        """One Encode message: each payload copied once, straight into it (a video's frame
        group is packed for it, then dropped)."""
        salt = prompt.salts.images or b""
        message = encoder_pb2.EncodeRequest(fingerprint=self.fingerprint, identity_salt=salt)
        for i in indices:
            added = message.items.add()
            added.item.CopyFrom(item_to_proto(prompt.items[i]))
            added.image = bytes(prompt.images[i])
        return message

    async def _encode_now(
        self, prompt: PreparedPrompt, indices: Sequence[int], request_id: str
    ) -> None:
        batches = self._encode_batches(prompt, indices)
        metrics.ENCODE_DISPATCHED.inc(len(indices))
        with _tracer.start_as_current_span("gateway.encode") as span:
            span.set_attribute("iris.images", len(indices))
            task = asyncio.ensure_future(self._encode_batches_in_turn(prompt, batches))
            await asyncio.wait({task})
        _raise_for_encode(task, request_id)

    async def _generate(
        self,
        prompt: PreparedPrompt,
        sampling: common_pb2.SamplingParams,
        request_id: str,
        attempt_id: str,
        pod: Pod,
        encode: asyncio.Task | None,
    ) -> Generation:
        carrier = inject_headers()
        request = llm_pb2.GenerateRequest(
            request_id=attempt_id,
            input_ids=prompt.input_ids.tolist(),
            items=[item_to_proto(item) for item in prompt.items],
            sampling=sampling,
            trace=common_pb2.TraceContext(
                traceparent=carrier.get("traceparent", ""),
                tracestate=carrier.get("tracestate", ""),
            ),
            fingerprint=self.fingerprint,
            cache_salt=prompt.salts.prefix or b"",
        )
        stub = self.registry.connection(pod.address).stub
        call = stub.Generate(request, timeout=self.generate_timeout_s, metadata=grpc_metadata())
        try:
            first = await self._await_accept(call, encode, request_id)
        except BaseException:
            call.cancel()
            raise
        if first is grpc.aio.EOF or not first.HasField("accepted"):
            raise upstream_failure(
                503,
                "the LLM pod did not accept the request",
                code="upstream_error",
                request_id=request_id,
                detail=f"pod {pod.address} sent "
                + ("nothing" if first is grpc.aio.EOF else first.WhichOneof("kind"))
                + " before accepting",
            )
        return Generation(request_id, pod, first.accepted, call, idle_s=self.stream_idle_s)

    async def _await_accept(self, call, encode: asyncio.Task | None, request_id: str):
        """The first message; an encode that fails meanwhile ends the wait early."""
        read = asyncio.ensure_future(call.read())
        waiting = {read} if encode is None else {read, encode}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.accept_timeout_s
        try:
            while True:
                done, _ = await asyncio.wait(
                    waiting, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    raise APIError(
                        503, f"no acceptance within {self.accept_timeout_s} s", code="timeout"
                    )
                if read in done:
                    return read.result()
                waiting.discard(encode)
                _raise_for_encode(encode, request_id)
        finally:
            if not read.done():
                read.cancel()


def _raise_for_encode(task: asyncio.Task, request_id: str) -> None:
    """An encode outcome that dooms the request: every encoder full (429 with their retry
    hint), no encoder (503), a put the cache refused (503 + Retry-After) or a bad image
    (400). A refusal of the image itself keeps its reason; an encoder fault is told
    without it."""
    error = task.exception()
    if isinstance(error, EncodersFull):
        full = upstream_failure(
            429,
            f"every encoder is full; retry after {error.retry_after_s} s",
            code="encoders_full",
            request_id=request_id,
            detail=str(error),
        )
        full.retry_after = error.retry_after_s
        raise full
    if isinstance(error, EncodersUnavailable):
        raise upstream_failure(
            503,
            "no encoder is available",
            code="encoder_unavailable",
            request_id=request_id,
            detail=str(error),
        )
    if isinstance(error, grpc.aio.AioRpcError):
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise bad_request(
                f"image rejected by the encoder: {error.details()}", "messages", "invalid_image"
            )
        raise upstream_failure(
            503,
            "the encoder failed",
            code="encoder_unavailable",
            request_id=request_id,
            detail=f"{error.code().name} {error.details()}",
        )
    if error is not None:
        raise error
    for result in task.result().results:
        if not result.ok and result.retryable:
            # The image is fine; the cache could not take its embedding (the encoder gave
            # the lease up): the same request may succeed at once.
            stored = upstream_failure(
                503,
                "the embedding could not be stored; retry",
                code="cache_unavailable",
                request_id=request_id,
                detail=result.error,
            )
            stored.retry_after = 1
            raise stored
        if not result.ok:
            raise bad_request(
                f"image could not be encoded: {result.error}", "messages", "invalid_image"
            )


def deadline_error(pod: Pod, err: grpc.aio.AioRpcError, request_id: str) -> APIError:
    """Generate ran past its gRPC deadline (IRIS_GATEWAY_GENERATE_TIMEOUT_S)."""
    return upstream_failure(
        504,
        "the LLM pod ran past the Generate deadline",
        code="upstream_timeout",
        request_id=request_id,
        detail=f"pod {pod.address}: {err.details()}",
    )


def upstream_error(err: grpc.aio.AioRpcError, request_id: str, pod: str) -> APIError:
    """A pod's refusal before acceptance, as the client's HTTP status. A refusal of the
    request's own content (INVALID_ARGUMENT, OUT_OF_RANGE) keeps the pod's reason, which
    names the offending value; any other keeps its detail for the log."""
    code, details = err.code(), err.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return upstream_failure(
            504,
            "the LLM pod ran past the Generate deadline",
            code="upstream_timeout",
            request_id=request_id,
            detail=f"pod {pod}: {details}",
        )
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
        return bad_request(details, code="invalid_request")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        error = upstream_failure(
            429,
            "the LLM pod is full; retry later",
            code="overloaded",
            request_id=request_id,
            detail=f"pod {pod}: {details}",
        )
        error.retry_after = 1
        return error
    if code == grpc.StatusCode.DATA_LOSS:
        # This request's own data (an embedding) failed a check on the pod: the reason
        # names the request's item, not the platform.
        return APIError(
            500, f"this request's data failed on the LLM pod: {details}", code="internal_error"
        )
    if code == grpc.StatusCode.FAILED_PRECONDITION and CACHE_UNAVAILABLE in details:
        return upstream_failure(
            503,
            "the embedding cache is unavailable",
            code="cache_unavailable",
            request_id=request_id,
            detail=f"pod {pod}: {details}",
        )
    return upstream_failure(
        503,
        "the LLM pod failed",
        code="upstream_error",
        request_id=request_id,
        detail=f"pod {pod}: {code.name} {details}",
    )


def _seconds_per(rate: float) -> float:
    return 1.0 / rate if rate > 0 else 0.0
