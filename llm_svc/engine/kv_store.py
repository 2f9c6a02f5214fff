"""The shared KV store: pages every pod writes and any pod reads, beyond its own tiers
(docs/design/engine.md, "KV tiers"; docs/design/security.md for who may reach it).

Backends: Redis or Valkey (one node, `redis://` / `rediss://`), a Redis Cluster (seed
`host:port` list), or `memory` (a dict in this process, shared by every engine in it under
one name: for tests and trying the path, not shared between pods).

Keys name everything that decides a unit's bytes:
    iris-kv:<fingerprint>:<tenant salt's hash>:<kind>:tp<size>.<rank>:<chained block hash>
The block hash is chained from the model fingerprint and the tenant salt too, so a request
under one salt can never name another salt's pages. Values carry the integrity checksum of
the embedding entries (embedding_cache_svc/integrity.py) over the unit's bytes; a value whose
checksum fails is dropped, counted and never served.

Writes run on a thread of their own, batched into one pipeline, from a bounded queue: when
the store is slow the queue fills and further writes are dropped (counted), never the step.
Each queued unit names the device (or host) buffer it is read from and that buffer's
generation at queue time; a buffer reused before the writer read it is skipped, so a
write never mixes two pages. Reads (`fetch`) run on the engine thread, pipelined: one round
trip per `BATCH` pages. A store that fails (down, slow past its timeout) is left alone for
`retry_s`: requests prefill as they would without it, the pod stays ready, and a log line
and a metric say so.
"""

from __future__ import annotations

import logging
import queue
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import blake3

from embedding_cache_svc.integrity import checksum
from iris.rates import Rate

log = logging.getLogger(__name__)

BATCH = 64  # pages a read round trip covers
_MAGIC = b"IKV1"
_HEADER = struct.Struct("<4sQQ")  # magic, checksum, payload length


@dataclass(frozen=True)
class KVStoreConfig:
    """Where the store is and how to reach it (IRIS_LLM_KV_STORE_*)."""

    kind: str  # memory | redis | redis-cluster
    url: str = ""  # redis: redis://host:port/db; memory: its name
    cluster_nodes: tuple[str, ...] = ()
    password: str | None = None
    tls: bool = False
    tls_verify: bool = True
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    timeout_s: float = 0.5
    write_queue: int = 1024  # units waiting to be written, at most
    retry_s: float = 5.0  # after a failure, the store is left alone this long

    def __post_init__(self) -> None:
        if self.kind not in ("memory", "redis", "redis-cluster"):
            raise ValueError(f"kv store must be memory, redis or redis-cluster, got {self.kind!r}")
        if self.kind == "redis" and not self.url:
            raise ValueError("kv store redis needs IRIS_LLM_KV_STORE_URL (redis://host:port/db)")
        if self.kind == "redis-cluster" and not self.cluster_nodes:
            raise ValueError("kv store redis-cluster needs IRIS_LLM_KV_STORE_CLUSTER_NODES")
        if self.timeout_s <= 0 or self.write_queue < 1 or self.retry_s < 0:
            raise ValueError(
                f"kv store timeout_s must be > 0, write_queue >= 1 and retry_s >= 0, got "
                f"{self.timeout_s}, {self.write_queue}, {self.retry_s}"
            )


def unit_key(
    fingerprint: bytes, salt: bytes, kind: str, tp: tuple[int, int], block_hash: bytes
) -> bytes:
    """The store key of one unit (see the module docstring)."""
    tenant = blake3.blake3(salt).hexdigest()[:16] if salt else "shared"
    return (
        f"iris-kv:{fingerprint.hex()[:16]}:{tenant}:{kind}:tp{tp[0]}.{tp[1]}:{block_hash.hex()}"
    ).encode()


def encode(payload: bytes) -> bytes:
    return _HEADER.pack(_MAGIC, checksum(payload), len(payload)) + payload


def decode(value: bytes) -> bytes | None:
    """The payload, or None when the value is damaged (wrong header, length or checksum)."""
    if len(value) < _HEADER.size:
        return None
    magic, expected, length = _HEADER.unpack_from(value)
    payload = value[_HEADER.size :]
    if magic != _MAGIC or length != len(payload) or checksum(payload) != expected:
        return None
    return payload


# --- backends ------------------------------------------------------------------------
class MemoryBackend:
    """A bounded dict shared by name within this process (least recently used goes)."""

    _stores: dict[str, OrderedDict[bytes, bytes]] = {}
    _lock = threading.Lock()
    capacity = 1 << 30  # bytes per named store

    def __init__(self, name: str) -> None:
        with self._lock:
            self.data = self._stores.setdefault(name, OrderedDict())

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        with self._lock:
            values = [self.data.get(key) for key in keys]
            for key, value in zip(keys, values, strict=True):
                if value is not None:
                    self.data.move_to_end(key)
            return values

    def set_many(self, items: list[tuple[bytes, bytes]]) -> None:
        with self._lock:
            for key, value in items:
                self.data[key] = value
            total = sum(len(value) for value in self.data.values())
            while total > self.capacity and self.data:
                total -= len(self.data.popitem(last=False)[1])

    def close(self) -> None:
        pass


class RedisBackend:
    """Redis / Valkey, one node or a Cluster, with pipelines (no transactions)."""

    def __init__(self, config: KVStoreConfig) -> None:
        import redis
        from redis.cluster import ClusterNode, RedisCluster

        options: dict = {
            "socket_connect_timeout": config.timeout_s,
            "socket_timeout": config.timeout_s,
        }
        if config.password:
            options["password"] = config.password
        tls: dict = {}
        if config.tls or config.url.startswith("rediss://"):
            tls = {"ssl_cert_reqs": "required" if config.tls_verify else "none"}
            for name, value in (("ssl_ca_certs", config.tls_ca_file),
                                ("ssl_certfile", config.tls_cert_file),
                                ("ssl_keyfile", config.tls_key_file)):  # fmt: skip
                if value:
                    tls[name] = value
        if config.kind == "redis-cluster":
            seeds = []
            for address in config.cluster_nodes:
                host, _, port = address.rpartition(":")
                seeds.append(ClusterNode(host.strip("[]"), int(port)))
            if tls:
                options["ssl"] = True
            self.client = RedisCluster(startup_nodes=seeds, **options, **tls)
        else:
            url = config.url
            if config.tls and url.startswith("redis://"):
                url = "rediss://" + url[len("redis://") :]
            self.client = redis.Redis.from_url(url, **options, **tls)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        return pipe.execute()

    def set_many(self, items: list[tuple[bytes, bytes]]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for key, value in items:
            pipe.set(key, value)
        pipe.execute()

    def close(self) -> None:
        self.client.close()


def make_backend(config: KVStoreConfig):
    return MemoryBackend(config.url) if config.kind == "memory" else RedisBackend(config)


# --- the client ----------------------------------------------------------------------
@dataclass
class StoreStats:
    """Counters since start (the engine thread and the writer add; metrics read)."""

    hits: int = 0  # pages read from the store
    misses: int = 0  # lookups that ended a run (the next page was not there)
    bytes_read: int = 0
    bytes_written: int = 0
    checksum_failures: int = 0
    dropped_writes: int = 0
    skipped_writes: int = 0  # the buffer was reused before the writer read it
    errors: int = 0
    available: bool = True
    fetch_seconds: list[float] = field(default_factory=list)  # per lookup, drained by metrics


@dataclass
class PendingWrite:
    key: bytes
    read: Callable[[], bytes]  # the unit's bytes, read by the writer thread
    still_valid: Callable[[], bool]  # False once its buffer was reused
    # A page's block hash, announced (`take_written`) once the store holds it; None: a unit
    # that is not announced (window pages and snapshots travel with their page).
    announce: bytes | None = None


class KVStoreClient:
    """`fetch` (engine thread) and `write` (queued; a thread writes), `flush`, `close`."""

    def __init__(self, config: KVStoreConfig, backend=None) -> None:
        self.config = config
        self.backend = backend if backend is not None else make_backend(config)
        self.stats = StoreStats()
        # Block hashes of pages written, for the pod's KV events (the writer appends, the
        # engine thread takes: deque appends and pops are atomic).
        self._written: deque[bytes] = deque()
        self.fetch_rate = Rate()  # bytes per second of lookups that found something
        # Called from the writer thread after pages were written (the pod's worker wakes to
        # publish their events).
        self.on_written: Callable[[], None] | None = None
        self._queue: queue.Queue[PendingWrite | None] = queue.Queue(config.write_queue)
        self._down_until = 0.0
        self._idle = threading.Event()
        self._idle.set()
        self._writer = threading.Thread(target=self._write_loop, name="kv-store-writer",
                                        daemon=True)  # fmt: skip
        self._writer.start()

    @property
    def usable(self) -> bool:
        """False for `retry_s` after a failure (then it is tried again)."""
        if time.monotonic() < self._down_until:
            return False
        if not self.stats.available:
            self.stats.available = True
            log.info("kv store: trying it again")
        return True

    def take_written(self) -> list[bytes]:
        """Block hashes of the pages written since the last call, oldest first."""
        written = []
        while self._written:
            written.append(self._written.popleft())
        return written

    def fetch(self, keys: list[list[bytes]]) -> list[list[bytes | None]]:
        """For consecutive pages, each a list of keys (its page first, then optional units),
        the payloads present, stopping after the first page whose first key is missing or
        damaged; at most one round trip per BATCH pages. [] when the store is unusable."""
        if not self.usable:
            return []
        found: list[list[bytes | None]] = []
        started, read_before = time.perf_counter(), self.stats.bytes_read
        try:
            for start in range(0, len(keys), BATCH):
                batch = keys[start : start + BATCH]
                flat = [key for page in batch for key in page]
                values = iter(self.backend.get_many(flat))
                for page in batch:
                    payloads = [self._payload(next(values)) for _ in page]
                    if payloads[0] is None:
                        self.stats.misses += 1
                        return found
                    found.append(payloads)
                    self.stats.hits += 1
        except Exception as err:  # noqa: BLE001 - any store failure: prefill instead
            self._failed("read", err)
            return found
        finally:
            seconds = time.perf_counter() - started
            self.stats.fetch_seconds.append(seconds)
            if self.stats.bytes_read > read_before:
                self.fetch_rate.observe(self.stats.bytes_read - read_before, seconds)
        return found

    def _payload(self, value: bytes | None) -> bytes | None:
        if value is None:
            return None
        payload = decode(value)
        if payload is None:
            self.stats.checksum_failures += 1
            log.warning("kv store: a value failed its checksum; dropped, not served")
            return None
        self.stats.bytes_read += len(payload)
        return payload

    def write(self, pending: PendingWrite) -> None:
        """Queue a unit for the store; dropped (counted) when the queue is full or the
        store unusable: the step never waits for the store."""
        if not self.usable:
            self.stats.dropped_writes += 1
            return
        try:
            self._idle.clear()
            self._queue.put_nowait(pending)
        except queue.Full:
            self.stats.dropped_writes += 1

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued write is done (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._queue.empty() and self._idle.wait(0.05):
                return True
        return False

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join(timeout=5)
        self.backend.close()

    def _write_loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            self._write(batch)
            if self._queue.empty():
                self._idle.set()

    def _write(self, batch: list[PendingWrite]) -> None:
        items, announced = [], []
        for pending in batch:
            payload = pending.read()
            if not pending.still_valid():
                self.stats.skipped_writes += 1
                continue
            items.append((pending.key, encode(payload)))
            if pending.announce is not None:
                announced.append(pending.announce)
        if not items or not self.usable:
            self.stats.dropped_writes += len(items)
            return
        try:
            self.backend.set_many(items)
            self.stats.bytes_written += sum(len(value) for _, value in items)
            self._written.extend(announced)
            if announced and self.on_written is not None:
                self.on_written()
        except Exception as err:  # noqa: BLE001 - any store failure: drop, never block
            self.stats.dropped_writes += len(items)
            self._failed("write", err)

    def _failed(self, what: str, err: Exception) -> None:
        self.stats.errors += 1
        if self.usable:
            log.warning(
                "kv store unreachable (%s failed: %s); requests prefill without it for %.0f s",
                what, err, self.config.retry_s,
            )  # fmt: skip
        self._down_until = time.monotonic() + self.config.retry_s
        self.stats.available = False
