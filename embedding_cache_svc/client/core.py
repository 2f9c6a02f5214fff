"""What the sync and async clients share: construction (`ClientBase`), request building,
chunking, reply parsing, tensor assembly and checksum checks, and the L1 tier. No I/O
happens here; the two clients only differ in how they open a channel and make the calls."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from embedding_cache_svc import entry
from embedding_cache_svc.client.errors import CacheInvalidArgument
from embedding_cache_svc.client.l1 import L1Cache
from embedding_cache_svc.dtypes import ITEM_SIZES
from embedding_cache_svc.entry import Failed, Status
from embedding_cache_svc.proto import cache_pb2, cache_pb2_grpc
from iris.mtls import TLSFiles
from iris.proto import common_pb2
from iris.telemetry import grpc_metadata

log = logging.getLogger(__name__)
DEFAULT_CHUNK_BYTES = 1 << 20
# Messages carry at most one chunk plus a small header; this leaves room for both.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.max_send_message_length", 8 << 20),
    # A restarted cache is found again within 2 s (gRPC's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]

Request = tuple[bytes, int]  # (item key, expected token_count)


def _checked(fingerprint: bytes, key: bytes) -> bytes:
    try:
        return entry.cache_key(fingerprint, key)
    except entry.InvalidRequest as err:
        raise CacheInvalidArgument(str(err)) from None


@dataclass
class GetPlan:
    """A get_many in progress: L1 hits are in `results`; `missing` goes to the service."""

    hidden: int
    dtype: str
    hold: bool
    results: dict[bytes, object] = field(default_factory=dict)
    missing: list[Request] = field(default_factory=list)


class Assembler:
    """Rebuilds tensors from a BatchGet stream of GetChunk messages (see cache.proto)."""

    def __init__(self, plan: GetPlan) -> None:
        self.plan = plan
        self.corrupt: list[bytes] = []  # keys whose bytes failed the checksum (reported)
        self.fetched: dict[bytes, object] = {}  # key -> tensor, for the L1
        self._index = -1
        self._header: cache_pb2.EntryHeader | None = None
        self._buffer = bytearray()
        self._view = memoryview(self._buffer)
        self._filled = 0

    def feed(self, message: cache_pb2.GetChunk) -> None:
        key = self.plan.missing[message.index][0]
        if message.status == cache_pb2.PRESENT:
            self._start(message)
        elif message.status == cache_pb2.MISS:
            if message.index == self._index:
                self._header = None  # cut short: drop the partial bytes
            self.plan.results[key] = None
        elif message.status == cache_pb2.FAILED:
            self.plan.results[key] = Failed(message.reason)
        elif self._header is not None and message.index == self._index:
            self._append(key, message.data)

    def _start(self, message: cache_pb2.GetChunk) -> None:
        header = message.header
        size = ITEM_SIZES.get(header.tensor.dtype, 0)
        self._index = message.index
        self._header = header if size else None  # an unknown dtype is never assembled
        self._buffer = bytearray(header.token_count * header.hidden * size)
        self._view = memoryview(self._buffer)
        self._filled = 0
        if not size:
            self.plan.results[self.plan.missing[message.index][0]] = None

    def _append(self, key: bytes, data: bytes) -> None:
        end = self._filled + len(data)
        if end > len(self._buffer):
            self._header = None
            self.plan.results[key] = None
            return
        self._view[self._filled : end] = data
        self._filled = end
        if end == len(self._buffer):
            self._complete(key)

    def _complete(self, key: bytes) -> None:
        from embedding_cache_svc.client import tensors

        header, self._header = self._header, None
        requested = self.plan.missing[self._index][1]
        if (header.token_count, header.hidden) != (requested, self.plan.hidden):
            log.warning("cache answered %s with another shape; treated as a miss", key.hex())
            self.plan.results[key] = None
            return
        tensor = tensors.decode(
            self._buffer, header.token_count, header.hidden, header.tensor.dtype
        )
        if not tensors.verify(tensor, header.tensor.checksum):  # over the bytes as stored
            log.warning("checksum mismatch for cache entry %s: discarded", key.hex())
            self.corrupt.append(key)
            self.plan.results[key] = None
            return
        if header.tensor.dtype != self.plan.dtype:  # another producer's dtype: convert on read
            tensor = tensor.to(tensors.TORCH_DTYPES[self.plan.dtype])
        self.plan.results[key] = tensor
        self.fetched[key] = tensor


class ClientCore:
    """Shared state and message logic of CacheClient and AsyncCacheClient."""

    def __init__(
        self,
        fingerprint: bytes,
        l1: L1Cache | None,
        timeout_s: float,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        try:
            self.fingerprint = entry.check_fingerprint(fingerprint)
        except entry.InvalidRequest as err:
            raise CacheInvalidArgument(str(err)) from None
        if timeout_s <= 0:
            raise CacheInvalidArgument(f"timeout_s must be > 0, got {timeout_s}")
        self.l1 = l1
        self.timeout_s = timeout_s
        self.chunk_bytes = chunk_bytes

    def _l1_key(self, key: bytes) -> bytes:
        return self.fingerprint + key

    def forget(self, key: bytes) -> None:
        """Drop the L1's copy of `key` (unless held): it was found damaged."""
        if self.l1 is not None:
            self.l1.drop(self._l1_key(key))

    # --- put -------------------------------------------------------------------------
    def put_messages(self, key: bytes, tensor, token_count: int) -> Iterator[cache_pb2.PutChunk]:
        """Header first, then the bytes in chunks (encoded before the first yield, so a bad
        tensor raises here, not inside the RPC)."""
        from embedding_cache_svc.client import tensors

        _checked(self.fingerprint, key)
        dtype, hidden, checksum, data = tensors.encode(tensor, token_count)
        header = cache_pb2.EntryHeader(
            token_count=token_count,
            hidden=hidden,
            tensor=common_pb2.TensorHeader(
                dtype=dtype, shape=[token_count, hidden], checksum=checksum
            ),
            fingerprint=self.fingerprint,
        )
        first = cache_pb2.PutChunk(fingerprint=self.fingerprint, key=key, header=header)
        return _put_stream(first, data, self.chunk_bytes)

    # --- get -------------------------------------------------------------------------
    def plan_get(self, requests: Sequence[Request], hidden: int, dtype, hold: bool) -> GetPlan:
        """Look each request up in the L1; what is left is `plan.missing`."""
        from embedding_cache_svc.client import tensors

        plan = GetPlan(hidden, tensors.dtype_name(dtype), hold)
        seen: set[bytes] = set()
        for key, token_count in requests:
            _checked(self.fingerprint, key)
            if key in seen:
                continue
            seen.add(key)
            cached = None
            if self.l1 is not None:
                cached = self.l1.get(self._l1_key(key), token_count, hidden, plan.dtype, hold)
            if cached is not None:
                plan.results[key] = cached
            else:
                plan.missing.append((key, token_count))
        return plan

    def get_request(self, plan: GetPlan) -> cache_pb2.BatchGetRequest:
        return cache_pb2.BatchGetRequest(
            fingerprint=self.fingerprint,
            items=[cache_pb2.ItemRequest(key=k, token_count=n) for k, n in plan.missing],
            hidden=plan.hidden,
            dtype=plan.dtype,
        )

    def finish_get(self, plan: GetPlan, assembler: Assembler) -> dict[bytes, object]:
        """Fill the L1 with what arrived; every requested key gets a value."""
        for key, tensor in assembler.fetched.items():
            if self.l1 is not None:
                token_count = tensor.shape[0]
                self.l1.put(
                    self._l1_key(key), tensor, token_count, plan.hidden, plan.dtype, plan.hold
                )
        for key, _ in plan.missing:
            plan.results.setdefault(key, None)
        return plan.results

    def release(self, keys: Sequence[bytes]) -> None:
        if self.l1 is not None:
            self.l1.release([self._l1_key(key) for key in keys])

    # --- small calls -----------------------------------------------------------------
    def keys_request(self, keys: Sequence[bytes]) -> cache_pb2.KeysRequest:
        for key in keys:
            _checked(self.fingerprint, key)
        return cache_pb2.KeysRequest(fingerprint=self.fingerprint, keys=list(keys))

    def reserve_request(
        self, items: Sequence[Request], lease_ms: int, take_over: bool = False
    ) -> cache_pb2.ReserveRequest:
        if lease_ms <= 0:
            raise CacheInvalidArgument(f"lease_ms must be > 0, got {lease_ms}")
        return cache_pb2.ReserveRequest(
            fingerprint=self.fingerprint,
            items=self._items(items),
            lease_ms=int(lease_ms),
            take_over=take_over,
        )

    def wait_request(self, items: Sequence[Request], deadline_s: float) -> cache_pb2.WaitRequest:
        if deadline_s < 0:
            raise CacheInvalidArgument(f"deadline_s must be >= 0, got {deadline_s}")
        return cache_pb2.WaitRequest(
            fingerprint=self.fingerprint,
            items=self._items(items),
            deadline_ms=int(deadline_s * 1000),
        )

    def fail_request(self, key: bytes, reason: str, token_count: int) -> cache_pb2.FailRequest:
        _checked(self.fingerprint, key)
        if token_count <= 0:
            raise CacheInvalidArgument(f"token_count must be > 0, got {token_count}")
        return cache_pb2.FailRequest(
            fingerprint=self.fingerprint, key=key, reason=reason, token_count=token_count
        )

    def report_request(self, key: bytes, reason: str) -> cache_pb2.ReportCorruptRequest:
        _checked(self.fingerprint, key)
        return cache_pb2.ReportCorruptRequest(
            fingerprint=self.fingerprint, key=key, reason=reason[:1024]
        )

    def _items(self, items: Sequence[Request]) -> list[cache_pb2.ItemRequest]:
        for key, _ in items:
            _checked(self.fingerprint, key)
        return [cache_pb2.ItemRequest(key=key, token_count=count) for key, count in items]


def parse_states(reply: cache_pb2.StatesReply) -> list[Status | Failed]:
    return [
        Failed(state.reason) if state.status == cache_pb2.FAILED else Status(state.status)
        for state in reply.states
    ]


def stats_dict(reply: cache_pb2.StatsReply, l1: L1Cache | None) -> dict:
    out = {
        name: getattr(reply, name)
        for name in (
            "store",
            "entries",
            "bytes",
            "capacity_bytes",
            "hits",
            "misses",
            "discards",
            "evictions",
            "reservations",
        )
    }
    if l1 is not None:
        out["l1"] = {
            "entries": len(l1),
            "bytes": l1.bytes,
            "capacity_bytes": l1.capacity_bytes,
            "hits": l1.hits,
            "misses": l1.misses,
            "evictions": l1.evictions,
        }
    return out


def _put_stream(
    first: cache_pb2.PutChunk, data: memoryview, chunk_bytes: int
) -> Iterator[cache_pb2.PutChunk]:
    yield first
    for start in range(0, len(data), chunk_bytes):
        yield cache_pb2.PutChunk(data=bytes(data[start : start + chunk_bytes]))


class ClientBase:
    """A client of one cache service for one model fingerprint.

    Every call takes an explicit `timeout_s` (default: the constructor's) and raises
    CacheUnavailable / CacheTimeout / CacheInvalidArgument (see errors.py), never hangs.
    With `l1_bytes` > 0 (or a shared `l1`), `get_many` is served from an in-process LRU
    first. With `tls` enabled the channel is mutual TLS under this process's role
    certificate (iris/mtls). Subclasses set `open_channel` (iris.mtls's `sync_channel` or
    `aio_channel`) and may add `channel_options`.
    """

    open_channel: Callable[..., Any]
    channel_options: list[tuple[str, Any]] = CHANNEL_OPTIONS

    def __init__(
        self,
        address: str,
        fingerprint: bytes,
        *,
        l1_bytes: int = 0,
        l1: L1Cache | None = None,
        timeout_s: float = 5.0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        tls: TLSFiles | None = None,
    ) -> None:
        cache = l1 if l1 is not None else (L1Cache(l1_bytes) if l1_bytes else None)
        self.core = ClientCore(fingerprint, cache, timeout_s, chunk_bytes)
        self.address = address
        self._channel = type(self).open_channel(address, tls, "cache", self.channel_options)
        self._stub = cache_pb2_grpc.EmbeddingCacheStub(self._channel)

    @property
    def l1(self) -> L1Cache | None:
        return self.core.l1

    def _start_get(
        self, requests: Sequence[Request], hidden: int, dtype, hold: bool, timeout_s: float | None
    ) -> tuple[GetPlan, Any]:
        """The plan of a get_many and, for what the L1 did not answer, the BatchGet call
        whose messages go to an `Assembler(plan)` (None when nothing is left to fetch)."""
        plan = self.core.plan_get(requests, hidden, dtype, hold)
        if not plan.missing:
            return plan, None
        stream = self._stub.BatchGet(
            self.core.get_request(plan),
            timeout=timeout_s or self.core.timeout_s,
            metadata=grpc_metadata(),
        )
        return plan, stream
