"""The shared store: entries, failures and leases in Redis; nothing kept in this process.

Each entry is one string (layout in redis_format.py) with the entry TTL (failures: the
failed TTL); a lease is a small key set with ``SET NX PX``. Reserve and probe run as one
Lua script per batch, so each item's check-and-lease is atomic across service replicas.
Reads stream the value with GETRANGE, keeping the next range in flight while the current
one is sent on, so a large entry is never held whole in this process. Connection failures
and timeouts become StoreUnavailable after one immediate retry (a pooled connection may
be stale after a Redis restart); nothing waits longer than the configured op timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from embedding_cache_svc.entry import Failed, Header, header_from_stored
from embedding_cache_svc.settings import CacheSettings
from embedding_cache_svc.store import redis_format as fmt
from embedding_cache_svc.store.base import (
    FAILED,
    FREE,
    PENDING,
    PRESENT,
    RESERVED,
    EntryVanished,
    ItemState,
    Reading,
    Store,
    StoreStats,
    StoreUnavailable,
)

# KEYS: entry key and lease key of each item, interleaved. ARGV[1]: lease ms ("0" = probe
# only, take no lease); ARGV[2]: lease owner; ARGV[2+i]: item i's expected token count as
# 4 little-endian bytes, or "" for unchecked. Returns one string per item:
#   "P" present, "F<reason>" failed, then for absent (or "D"-discarded stale) entries
#   "R" reserved now, "W" leased by someone else, "" free (probe only).
_STATE_SCRIPT = """
local lease_ms = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS / 2 do
  local entry, lease = KEYS[2 * i - 1], KEYS[2 * i]
  local want = ARGV[2 + i]
  local head = redis.call('GETRANGE', entry, 0, 15)
  local state = ''
  if #head == 16 and string.sub(head, 1, 4) == 'IRE1' then
    if string.byte(head, 5) == 1 then
      state = 'F' .. redis.call('GETRANGE', entry, 16, -1)
    elseif want ~= '' and string.sub(head, 9, 12) ~= want then
      redis.call('DEL', entry)
      state = 'D'
    else
      state = 'P'
    end
  end
  if state == '' or state == 'D' then
    if lease_ms > 0 then
      if redis.call('SET', lease, ARGV[2], 'NX', 'PX', lease_ms) then
        state = state .. 'R'
      else
        state = state .. 'W'
      end
    elseif redis.call('EXISTS', lease) == 1 then
      state = state .. 'W'
    end
  end
  out[i] = state
end
return out
"""

FIRST_READ_SLACK = 4096  # bytes beyond one chunk read up front: preamble + header fit
_NETWORK_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError)


@contextlib.contextmanager
def _guard(url: str) -> Iterator[None]:
    """Turn Redis connectivity problems into StoreUnavailable (the servicer's UNAVAILABLE)."""
    try:
        yield
    except _NETWORK_ERRORS as err:
        raise StoreUnavailable(f"redis at {url} unavailable: {err}") from err
    except ResponseError as err:
        if str(err).startswith(("OOM", "LOADING", "MASTERDOWN", "READONLY")):
            raise StoreUnavailable(f"redis at {url} refused: {err}") from err
        raise


def _tls_url(url: str, tls: bool) -> str:
    parts = urlsplit(url)
    if tls and parts.scheme == "redis":
        return urlunsplit(parts._replace(scheme="rediss"))
    return url


def display_url(url: str) -> str:
    """host:port of a Redis URL, for messages (never the password)."""
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"


def connect(settings: CacheSettings) -> aioredis.Redis:
    """A pooled asyncio client built from settings (password and TLS included)."""
    url = _tls_url(settings.redis_url, settings.redis_tls)
    options: dict = {
        "socket_connect_timeout": settings.redis_connect_timeout_s,
        "socket_timeout": settings.redis_op_timeout_s,
        "retry": Retry(NoBackoff(), 1),
        "max_connections": settings.redis_max_connections,
    }
    if settings.redis_password:
        options["password"] = settings.redis_password
    if url.startswith("rediss://"):
        options["ssl_cert_reqs"] = "required" if settings.redis_tls_verify else "none"
        if settings.redis_tls_ca_file:
            options["ssl_ca_certs"] = settings.redis_tls_ca_file
        if settings.redis_tls_cert_file:
            options["ssl_certfile"] = settings.redis_tls_cert_file
        if settings.redis_tls_key_file:
            options["ssl_keyfile"] = settings.redis_tls_key_file
    return aioredis.Redis.from_url(url, **options)


class RedisStore(Store):
    """Entries under ``<prefix>e:<key>``, leases under ``<prefix>l:<key>``."""

    name = "redis"

    def __init__(
        self,
        client: aioredis.Redis,
        ttl_s: float,
        failed_ttl_s: float,
        key_prefix: str = "iris:",
        url: str = "redis",
        prefetch: int = 2,
        read_bytes: int = 256 << 10,
    ) -> None:
        self._redis = client
        self._ttl_ms = int(ttl_s * 1000)
        self._failed_ttl_ms = max(1, int(failed_ttl_s * 1000))
        self._entry_prefix = key_prefix.encode() + b"e:"
        self._lease_prefix = key_prefix.encode() + b"l:"
        self._url = url
        self._prefetch = prefetch
        self._read_bytes = read_bytes
        self._owner = uuid.uuid4().hex.encode()
        self._script = client.register_script(_STATE_SCRIPT)

    @classmethod
    def from_settings(cls, settings: CacheSettings) -> RedisStore:
        return cls(
            connect(settings),
            settings.ttl_s,
            settings.failed_ttl_s,
            settings.redis_key_prefix,
            url=display_url(settings.redis_url),
            read_bytes=settings.redis_read_bytes,
        )

    def _entry(self, key: bytes) -> bytes:
        return self._entry_prefix + key

    def _lease(self, key: bytes) -> bytes:
        return self._lease_prefix + key

    async def _write(self, key: bytes, parts: Sequence[bytes | bytearray], ttl_ms: int) -> None:
        with _guard(self._url):
            async with self._redis.pipeline(transaction=True) as pipe:
                # SET then APPEND inside MULTI: the tensor bytes go to the socket as they
                # are, without being joined to the prefix in Python first.
                pipe.set(self._entry(key), parts[0], px=ttl_ms or None)
                for part in parts[1:]:
                    pipe.append(self._entry(key), part)
                pipe.delete(self._lease(key))
                await pipe.execute()

    async def put(self, key: bytes, header: Header, data: bytes | bytearray) -> None:
        await self._write(key, [fmt.pack_embedding_prefix(header), data], self._ttl_ms)

    async def fail(self, key: bytes, reason: str) -> None:
        await self._write(key, [fmt.pack_failure(reason)], self._failed_ttl_ms)

    async def open(self, key: bytes, chunk_bytes: int) -> Reading | Failed | None:
        name = self._entry(key)
        with _guard(self._url):
            # The first read covers preamble, header and one whole read of data, so an
            # entry of up to `read_bytes` costs a single round trip.
            first = await self._redis.getrange(name, 0, self._read_bytes + FIRST_READ_SLACK - 1)
        if not first:
            return None
        try:
            kind, _, length = fmt.unpack_prefix(first)
        except fmt.CorruptEntry:
            await self.delete([key])
            return None
        body = fmt.PREAMBLE_BYTES + length
        if kind == fmt.KIND_FAILED:
            with _guard(self._url):
                whole = first if len(first) >= body else await self._redis.get(name) or b""
            return Failed(whole[fmt.PREAMBLE_BYTES : body].decode(errors="replace"))
        if len(first) < body:  # a header longer than the slack cannot be written by put
            await self.delete([key])
            return None
        header = header_from_stored(fmt.parse_header(first[fmt.PREAMBLE_BYTES : body]))
        return Reading(header, self._chunks(name, first, body, header.nbytes, chunk_bytes))

    async def _chunks(
        self, name: bytes, first: bytes, start: int, nbytes: int, chunk_bytes: int
    ) -> AsyncIterator[bytes]:
        """The data as pieces of at most chunk_bytes. Redis is read in ranges of
        `read_bytes`, the next ones in flight while the current one is sent on."""
        end = start + nbytes  # exclusive
        offset = min(len(first), end)
        for piece in _pieces(memoryview(first)[start:offset], chunk_bytes):
            yield piece
        ranges = [
            (lo, min(lo + self._read_bytes, end)) for lo in range(offset, end, self._read_bytes)
        ]
        inflight: list[asyncio.Task] = []
        try:
            for index, (lo, hi) in enumerate(ranges):
                for a, b in ranges[index + len(inflight) : index + self._prefetch]:
                    inflight.append(asyncio.ensure_future(self._redis.getrange(name, a, b - 1)))
                with _guard(self._url):
                    read = await inflight.pop(0)
                if len(read) != hi - lo:
                    raise EntryVanished(f"entry shrank mid-read at byte {lo}")
                for piece in _pieces(memoryview(read), chunk_bytes):
                    yield piece
        finally:
            for task in inflight:
                task.cancel()

    async def delete(self, keys: Sequence[bytes]) -> int:
        if not keys:
            return 0
        with _guard(self._url):
            return int(await self._redis.delete(*[self._entry(key) for key in keys]))

    async def abandon(self, keys: Sequence[bytes]) -> int:
        if not keys:
            return 0
        with _guard(self._url):
            return int(await self._redis.delete(*[self._lease(key) for key in keys]))

    async def exists(self, keys: Sequence[bytes]) -> list[bool]:
        if not keys:
            return []
        with _guard(self._url):
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.getrange(self._entry(key), 0, fmt.PREAMBLE_BYTES - 1)
                heads = await pipe.execute()
        out = []
        for head in heads:
            try:
                out.append(fmt.unpack_prefix(head)[0] == fmt.KIND_EMBEDDING)
            except fmt.CorruptEntry:
                out.append(False)
        return out

    async def _run_script(
        self, items: Sequence[tuple[bytes, int]], lease_ms: int
    ) -> list[ItemState]:
        if not items:
            return []
        keys: list[bytes] = []
        args: list[bytes | int] = [lease_ms, self._owner]
        for key, token_count in items:
            keys += [self._entry(key), self._lease(key)]
            args.append(fmt.token_count_bytes(token_count) if token_count else b"")
        with _guard(self._url):
            replies = await self._script(keys=keys, args=args)
        return [_decode_state(reply) for reply in replies]

    async def reserve(self, items: Sequence[tuple[bytes, int]], lease_ms: int) -> list[ItemState]:
        return await self._run_script(items, max(1, lease_ms))

    async def probe(self, items: Sequence[tuple[bytes, int]]) -> list[ItemState]:
        return await self._run_script(items, 0)

    async def stats(self) -> StoreStats:
        with _guard(self._url):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.dbsize()
                pipe.info("memory")
                pipe.info("stats")
                entries, memory, stats = await pipe.execute()
        return StoreStats(
            entries=int(entries),
            bytes=int(memory.get("used_memory", 0)),
            capacity_bytes=int(memory.get("maxmemory", 0)),
            evictions=int(stats.get("evicted_keys", 0)),
        )

    async def ping(self) -> None:
        with _guard(self._url):
            await self._redis.ping()

    async def close(self) -> None:
        await self._redis.aclose()


def _pieces(view: memoryview, chunk_bytes: int) -> Iterator[bytes]:
    """One Redis read as gRPC messages of at most chunk_bytes (the two sizes are set
    apart: small reads keep the next one in flight behind a small entry, too)."""
    for lo in range(0, len(view), chunk_bytes):
        yield bytes(view[lo : lo + chunk_bytes])


def _decode_state(reply: bytes) -> ItemState:
    if reply == b"P":
        return ItemState(PRESENT)
    if reply.startswith(b"F"):
        return ItemState(FAILED, reply[1:].decode(errors="replace"))
    discarded = "token_count" if reply.startswith(b"D") else None
    tail = reply[1:] if discarded else reply
    if tail == b"R":
        return ItemState(RESERVED, discarded=discarded)
    if tail == b"W":
        return ItemState(PENDING, discarded=discarded)
    return ItemState(FREE, discarded=discarded)
