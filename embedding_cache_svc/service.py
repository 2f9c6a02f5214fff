"""The gRPC servicer: thin translation between cache.proto and a Store.

Validation of what callers send happens here (via entry.py) and fails with
INVALID_ARGUMENT naming the value and the limit; a store that cannot be reached gives
UNAVAILABLE. Every read checks token count and hidden size against the request: an entry
that does not match is a miss for that caller and stays. An entry is dropped only when the
cache itself finds it damaged: bytes that do not add up to its header, or a reader's
ReportCorrupt that the cache's own check (checksum, NaN) confirms.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc
from opentelemetry import trace

from embedding_cache_svc import entry, integrity
from embedding_cache_svc.dtypes import ITEM_SIZES
from embedding_cache_svc.entry import Failed, InvalidRequest, Status
from embedding_cache_svc.metrics import CacheMetrics
from embedding_cache_svc.notifier import FIRST_POLL_S, Notifier, next_poll
from embedding_cache_svc.proto import cache_pb2, cache_pb2_grpc
from embedding_cache_svc.settings import CacheSettings
from embedding_cache_svc.store import EntryVanished, Store, StoreUnavailable
from embedding_cache_svc.store.base import Reading
from iris.telemetry import extract_grpc_metadata

log = logging.getLogger(__name__)
SETTLED = (Status.PRESENT, Status.FAILED, Status.FREE)
_tracer = trace.get_tracer(__name__)


def _parent(context: grpc.aio.ServicerContext):
    return extract_grpc_metadata(context.invocation_metadata())


def _span(op: str, context: grpc.aio.ServicerContext):
    """A server span for one call, child of the caller's trace (from gRPC metadata)."""
    return _tracer.start_as_current_span(f"cache.{op}", context=_parent(context))


def _rpc(op: str) -> Callable:
    """Time a unary handler and map domain errors onto gRPC status codes."""

    def wrap(handler: Callable) -> Callable:
        @functools.wraps(handler)
        async def run(self: CacheServicer, request, context: grpc.aio.ServicerContext):
            with self.metrics.timed(op), _span(op, context):
                try:
                    return await handler(self, request, context)
                except InvalidRequest as err:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
                except StoreUnavailable as err:
                    self.metrics.store_error()
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))

        return run

    return wrap


class CacheServicer(cache_pb2_grpc.EmbeddingCacheServicer):
    """Implements EmbeddingCache over `store` with the limits in `settings`."""

    def __init__(self, store: Store, settings: CacheSettings, metrics: CacheMetrics) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.notifier = Notifier()
        self.waiting = 0  # Wait calls in progress (tests and debugging read it)

    # --- request checks --------------------------------------------------------------
    def _items(self, fingerprint: bytes, items) -> list[tuple[bytes, int]]:
        if len(items) > self.settings.max_batch_items:
            raise InvalidRequest(
                f"{len(items)} items in one call, limit {self.settings.max_batch_items}"
            )
        return [(entry.cache_key(fingerprint, item.key), item.token_count) for item in items]

    def _keys(self, request: cache_pb2.KeysRequest) -> list[bytes]:
        if len(request.keys) > self.settings.max_batch_items:
            raise InvalidRequest(
                f"{len(request.keys)} keys in one call, limit {self.settings.max_batch_items}"
            )
        return [entry.cache_key(request.fingerprint, key) for key in request.keys]

    # --- Put -------------------------------------------------------------------------
    async def Put(self, request_iterator, context):
        with self.metrics.timed("put"), _span("put", context):
            try:
                key, header, data = await self._receive(request_iterator)
                await self.store.put(key, header, data)
            except InvalidRequest as err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            except StoreUnavailable as err:
                self.metrics.store_error()
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
            self.notifier.changed()
            return cache_pb2.PutReply(bytes_stored=len(data))

    async def _receive(self, chunks) -> tuple[bytes, entry.Header, bytearray]:
        key = header = None
        data = bytearray()
        view = memoryview(data)
        filled = 0
        async for chunk in chunks:
            if header is None:
                key = entry.cache_key(chunk.fingerprint, chunk.key)
                if not chunk.HasField("header"):
                    raise InvalidRequest("the first Put message must carry the header")
                header = entry.header_from_proto(
                    chunk.header, key[: entry.FINGERPRINT_BYTES], self.settings.max_entry_bytes
                )
                data = bytearray(header.nbytes)  # filled in place: one copy of the bytes
                view = memoryview(data)
            piece = chunk.data
            if filled + len(piece) > header.nbytes:
                raise InvalidRequest(
                    f"more than the header's {header.nbytes} bytes sent "
                    f"({filled + len(piece)} so far)"
                )
            view[filled : filled + len(piece)] = piece
            filled += len(piece)
        if header is None:
            raise InvalidRequest("Put sent no messages")
        if filled != header.nbytes:
            raise InvalidRequest(f"{filled} bytes sent, the header says {header.nbytes}")
        return key, header, data

    # --- BatchGet --------------------------------------------------------------------
    async def BatchGet(self, request, context) -> AsyncIterator[cache_pb2.GetChunk]:
        start = time.perf_counter()
        span = _tracer.start_span("cache.get", context=_parent(context))
        span.set_attribute("iris.cache.items", len(request.items))
        try:
            items = self._items(request.fingerprint, request.items)
            if request.dtype and request.dtype not in ITEM_SIZES:
                raise InvalidRequest(
                    f"unknown dtype {request.dtype!r}; supported: {', '.join(ITEM_SIZES)}"
                )
        except InvalidRequest as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        try:
            unavailable: list[StoreUnavailable] = []
            for index, (key, token_count) in enumerate(items):
                try:
                    async for message in self._get_one(index, key, token_count, request):
                        yield message
                except StoreUnavailable as err:
                    # Only this item's shard is out (a cluster node down): the others are
                    # still served, and this one is a miss (a MISS also drops the bytes
                    # a reader got before the cut).
                    self.metrics.store_error()
                    unavailable.append(err)
                    yield cache_pb2.GetChunk(index=index, status=cache_pb2.MISS)
            if items and len(unavailable) == len(items):
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(unavailable[0]))
        finally:
            self.metrics.latency.labels("get").observe(time.perf_counter() - start)
            span.end()

    async def _get_one(self, index: int, key: bytes, token_count: int, request):
        opened = await self.store.open(key, self.settings.chunk_bytes, token_count)
        if opened is None:
            self.metrics.miss()
            yield cache_pb2.GetChunk(index=index, status=cache_pb2.MISS)
            return
        if isinstance(opened, Failed):
            self.metrics.miss()
            yield cache_pb2.GetChunk(index=index, status=cache_pb2.FAILED, reason=opened.reason)
            return
        if opened.header.mismatch(token_count, request.hidden) is not None:
            # Another caller's count or size: a miss for this one, the entry stays.
            await opened.chunks.aclose()
            self.metrics.miss()
            yield cache_pb2.GetChunk(index=index, status=cache_pb2.MISS)
            return
        yield cache_pb2.GetChunk(
            index=index, status=cache_pb2.PRESENT, header=opened.header.to_proto()
        )
        expected, sent, intact = opened.header.nbytes, 0, True
        try:
            async for piece in opened.chunks:
                if sent + len(piece) > expected:
                    intact = False
                    break
                sent += len(piece)
                yield cache_pb2.GetChunk(index=index, data=piece)
        except EntryVanished:
            intact = False
        finally:
            await opened.chunks.aclose()
        if intact and sent == expected:
            self.metrics.hit()
            return
        # The bytes do not add up to the header (truncated or replaced mid-read): the
        # caller drops what it got for this index, and the entry goes.
        await self._discard(key, opened.header, "truncated")
        yield cache_pb2.GetChunk(index=index, status=cache_pb2.MISS)

    async def _discard(self, key: bytes, header: entry.Header, reason: str) -> None:
        log.warning("discarding cache entry %s: %s", key[entry.FINGERPRINT_BYTES :].hex(), reason)
        self.metrics.discard(reason)
        self.metrics.miss()
        await self.store.discard(key, header)
        self.notifier.changed()

    # --- small unary calls -----------------------------------------------------------
    @_rpc("exists")
    async def Exists(self, request, context):
        return cache_pb2.ExistsReply(present=await self.store.exists(self._keys(request)))

    @_rpc("delete")
    async def Delete(self, request, context):
        deleted = await self.store.delete(self._keys(request))
        self.notifier.changed()
        return cache_pb2.DeleteReply(deleted=deleted)

    @_rpc("abandon")
    async def Abandon(self, request, context):
        ended = await self.store.abandon(self._keys(request))
        self.notifier.changed()  # a waiter on the lease learns it is FREE now
        return cache_pb2.DeleteReply(deleted=ended)

    @_rpc("reserve")
    async def Reserve(self, request, context):
        if not 0 < request.lease_ms <= self.settings.max_lease_ms:
            raise InvalidRequest(
                f"lease_ms {request.lease_ms} is outside 1..{self.settings.max_lease_ms}"
            )
        states = await self.store.reserve(
            self._items(request.fingerprint, request.items), request.lease_ms, request.take_over
        )
        for state in states:
            self.metrics.reserved(state.status)
        return _states_reply(states)

    @_rpc("fail")
    async def Fail(self, request, context):
        key = entry.cache_key(request.fingerprint, request.key)
        if request.token_count <= 0:
            raise InvalidRequest(
                f"token_count {request.token_count}: a failure is recorded for a count > 0"
            )
        await self.store.fail(key, request.token_count, entry.check_reason(request.reason))
        self.notifier.changed()
        return cache_pb2.FailReply()

    @_rpc("report_corrupt")
    async def ReportCorrupt(self, request, context):
        """Check the stored entry; drop it only if the check fails here too."""
        key = entry.cache_key(request.fingerprint, request.key)
        reported = entry.check_reason(request.reason or "unspecified")
        opened = await self.store.open(key, self.settings.chunk_bytes)
        if not isinstance(opened, Reading):
            return cache_pb2.ReportCorruptReply(dropped=False, finding="absent")
        data = bytearray()
        try:
            async for piece in opened.chunks:
                data += piece
        except EntryVanished:
            return cache_pb2.ReportCorruptReply(dropped=False, finding="absent")
        header = opened.header
        if len(data) != header.nbytes:
            finding = "truncated"
        else:
            finding = integrity.finding(data, header.dtype, header.checksum)
        if finding == "intact":
            log.info("entry %s reported corrupt (%s) is intact", request.key.hex(), reported)
            return cache_pb2.ReportCorruptReply(dropped=False, finding=finding)
        dropped = await self.store.discard(key, header)
        if dropped:
            log.warning("dropped entry %s: %s (reported: %s)", request.key.hex(), finding, reported)
            self.metrics.discard(finding)
            self.notifier.changed()
        return cache_pb2.ReportCorruptReply(dropped=dropped, finding=finding)

    @_rpc("wait")
    async def Wait(self, request, context):
        if request.deadline_ms > self.settings.max_wait_ms:
            raise InvalidRequest(
                f"deadline_ms {request.deadline_ms} is over the limit of "
                f"{self.settings.max_wait_ms}"
            )
        items = self._items(request.fingerprint, request.items)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.deadline_ms / 1000
        poll_s = FIRST_POLL_S
        self.waiting += 1
        try:
            while True:
                generation = self.notifier.generation()
                states = await self.store.probe(items)
                left = deadline - loop.time()
                if left <= 0 or all(state.status in SETTLED for state in states):
                    return _states_reply(states)
                await self.notifier.wait_change(generation, min(poll_s, left))
                poll_s = next_poll(poll_s)
        finally:
            self.waiting -= 1

    @_rpc("stats")
    async def Stats(self, request, context):
        stats = await self.store.stats()
        self.metrics.observe_store(stats)
        totals = self.metrics.totals
        return cache_pb2.StatsReply(
            store=self.store.name,
            entries=stats.entries,
            bytes=stats.bytes,
            capacity_bytes=stats.capacity_bytes,
            hits=totals["hits"],
            misses=totals["misses"],
            discards=totals["discards"],
            evictions=stats.evictions,
            reservations=totals["reservations"],
        )


def _states_reply(states) -> cache_pb2.StatesReply:
    return cache_pb2.StatesReply(
        states=[cache_pb2.ItemState(status=s.status, reason=s.reason) for s in states]
    )
