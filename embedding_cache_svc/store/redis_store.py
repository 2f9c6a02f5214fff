"""The shared store: entries, failures and leases in Redis (one node or a Redis Cluster);
nothing kept in this process.

Each entry is one string (layout in redis_format.py) with the entry TTL (failures: the
failed TTL); a lease is a small key set with ``SET NX PX``. An item's entry and lease keys
share the hash tag ``{<hex cache key>}``, so on a cluster they live on one slot and each
item's check-and-lease is one atomic script there. Reserve and probe run one Lua script
per node (the batch's items grouped by the node owning their slot, the groups
concurrently, the answers put back in order); on one node that is one call per batch.
Reads stream the value with GETRANGE, keeping the next ranges in flight while the current
one is sent on, so a large entry is never held whole in this process. Connection failures
and timeouts become StoreUnavailable after one immediate retry (a pooled connection may
be stale after a Redis restart); nothing waits longer than the configured op timeout. On
a cluster an unreachable node fails only the calls that need it; the node is named in the
log, not in the error the caller sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import AskError, ClusterError, RedisClusterException, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from embedding_cache_svc.entry import Failed, Header, Status, header_from_stored
from embedding_cache_svc.settings import CacheSettings
from embedding_cache_svc.store import redis_format as fmt
from embedding_cache_svc.store.base import (
    EntryVanished,
    ItemState,
    Reading,
    Store,
    StoreStats,
    StoreUnavailable,
)
from embedding_cache_svc.store.redis_connect import connect, connect_cluster, display_url

log = logging.getLogger(__name__)

# ARGV[1]: lease ms ("0" = probe only, take no lease); ARGV[2]: lease owner; ARGV[3]: "1"
# to take over (or extend) a live lease, else "0"; ARGV[4]: the number of items n;
# ARGV[4+i]: item i's expected token count as 4 little-endian bytes, or
# "" for unchecked. KEYS: entry, lease and failure key of each item, in threes, when they
# share one slot (one node, or one item). A cluster node's batch spans several of its
# slots, which Redis refuses as declared keys: then KEYS is empty and the names follow
# the counts in ARGV, and the flag lets the script touch those keys of this node.
# Returns one string per item: "P" an embedding with the expected count, "F<reason>" a
# failure for that count, else "R" reserved now, "W" leased by someone else, "" free
# (probe only). An embedding with another count is no answer for this caller and is kept.
_STATE_SCRIPT = """#!lua flags=allow-cross-slot-keys
local lease_ms = tonumber(ARGV[1])
local take_over = ARGV[3] == '1'
local n = tonumber(ARGV[4])
local names, base = KEYS, 0
if #KEYS == 0 then
  names, base = ARGV, 4 + n
end
local out = {}
for i = 1, n do
  local entry = names[base + 3 * i - 2]
  local lease, failure = names[base + 3 * i - 1], names[base + 3 * i]
  local want = ARGV[4 + i]
  local head = redis.call('GETRANGE', entry, 0, 15)
  local state = ''
  if #head == 16 and string.sub(head, 1, 4) == 'IRE1' and string.byte(head, 5) == 0
      and (want == '' or string.sub(head, 9, 12) == want) then
    state = 'P'
  else
    local reason = redis.call('GET', failure)
    if reason then
      state = 'F' .. reason
    end
  end
  if state == '' then
    if lease_ms > 0 and take_over then
      redis.call('SET', lease, ARGV[2], 'PX', lease_ms)
      state = 'R'
    elseif lease_ms > 0 then
      if redis.call('SET', lease, ARGV[2], 'NX', 'PX', lease_ms) then
        state = 'R'
      else
        state = 'W'
      end
    elseif redis.call('EXISTS', lease) == 1 then
      state = 'W'
    end
  end
  out[i] = state
end
return out
"""

# Delete the entry KEYS[1] only if it still starts with ARGV[1] (preamble and header of
# the entry that was checked): a fresh Put since then is kept.
_DISCARD_SCRIPT = """
if redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] - 1) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

FIRST_READ_SLACK = 4096  # bytes beyond one read fetched up front: preamble + header fit
_NETWORK_ERRORS = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    asyncio.TimeoutError,
    ClusterError,  # CLUSTERDOWN, and redirects that ran out of attempts
    RedisClusterException,  # no seed reachable, a slot not covered
)
_REFUSALS = ("OOM", "LOADING", "MASTERDOWN", "READONLY", "CLUSTERDOWN", "TRYAGAIN")
# A node-targeted script whose keys are no longer all on that node (a slot moved).
_REDIRECTS = (AskError, RedisClusterException)
_NOT_LOCAL = "non local key"

Node = object  # a redis.asyncio.cluster.ClusterNode, or None on one node
LOG_EVERY_S = 1.0  # at most one warning a second per unreachable node


def _connection_dropped_mid_command(err: AttributeError) -> bool:
    """Whether `err` is redis-py's asyncio connection finding its socket gone mid-command.

    redis-py 8.1's asyncio connection, closed by a concurrent task (the cluster client
    dropping the connections of a node that failed), raises AttributeError (`'NoneType'
    object has no attribute 'writelines'`) instead of ConnectionError. It is a lost
    connection all the same; any other AttributeError is a bug and is raised."""
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and frames[-1].filename.endswith(
        ("redis/asyncio/connection.py", "redis/_parsers/base.py", "redis/_parsers/resp2.py",
         "redis/_parsers/resp3.py", "redis/_parsers/hiredis.py")
    )  # fmt: skip


class RedisStore(Store):
    """Entries under ``<prefix>e:{<hex key>}``, leases under ``<prefix>l:{<hex key>}``,
    failures under ``<prefix>f:{<hex key>}:<token count>`` (one hash tag: one slot).

    `client` is a `redis.asyncio.Redis` (store name "redis") or a `RedisCluster`
    ("redis-cluster"); only the grouping of batches by node differs between the two."""

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        ttl_s: float,
        failed_ttl_s: float,
        key_prefix: str = "iris:",
        url: str = "redis",
        prefetch: int = 2,
        read_bytes: int = 1 << 20,
    ) -> None:
        self._redis = client
        self._cluster = isinstance(client, RedisCluster)
        self.name = "redis-cluster" if self._cluster else "redis"
        self._ttl_ms = int(ttl_s * 1000)
        self._failed_ttl_ms = max(1, int(failed_ttl_s * 1000))
        self._entry_prefix = key_prefix.encode() + b"e:{"
        self._lease_prefix = key_prefix.encode() + b"l:{"
        self._failure_prefix = key_prefix.encode() + b"f:{"
        self._url = url
        self._prefetch = prefetch
        self._read_bytes = read_bytes
        self._owner = uuid.uuid4().hex.encode()
        self._logged: dict[str, float] = {}  # node -> when it was last logged as down

    @classmethod
    def from_settings(cls, settings: CacheSettings) -> RedisStore:
        if settings.store == "redis-cluster":
            client = connect_cluster(settings)
            url = "redis cluster " + ",".join(settings.redis_cluster_nodes)
        else:
            client, url = connect(settings), display_url(settings.redis_url)
        return cls(
            client,
            settings.ttl_s,
            settings.failed_ttl_s,
            settings.redis_key_prefix,
            url=url,
            read_bytes=settings.redis_read_bytes,
        )

    # --- keys and nodes --------------------------------------------------------------
    def _entry(self, key: bytes) -> bytes:
        # The tag is hex: a raw key may hold "{" or "}", which would split the tag.
        return self._entry_prefix + key.hex().encode() + b"}"

    def _lease(self, key: bytes) -> bytes:
        return self._lease_prefix + key.hex().encode() + b"}"

    def _failure(self, key: bytes, token_count: int) -> bytes:
        return self._failure_prefix + key.hex().encode() + b"}:" + str(token_count).encode()

    @contextlib.contextmanager
    def _guard(self, name: bytes | None = None) -> Iterator[None]:
        """Turn Redis connectivity problems into StoreUnavailable (the servicer's
        UNAVAILABLE). On a cluster the node goes to the log only."""
        try:
            yield
        except _NETWORK_ERRORS as err:
            raise self._unavailable("unavailable", err, name) from err
        except AttributeError as err:
            if not _connection_dropped_mid_command(err):
                raise
            raise self._unavailable("unavailable", err, name) from err
        except ResponseError as err:
            if str(err).startswith(_REFUSALS):
                raise self._unavailable("refused", err, name) from err
            raise

    def _unavailable(self, what: str, err: Exception, name: bytes | None) -> StoreUnavailable:
        if not self._cluster:
            return StoreUnavailable(f"redis at {self._url} {what}: {err}")
        node, now = self._node_name(name), time.monotonic()
        if now - self._logged.get(node, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged[node] = now
            log.warning("redis cluster node %s %s: %s", node, what, err)
        if name is None:
            return StoreUnavailable(f"redis cluster {what}: no node answers")
        return StoreUnavailable(f"redis cluster {what} for this entry's shard")

    def _node_name(self, name: bytes | None) -> str:
        if name is None:
            return "(cluster)"
        try:
            slot = self._redis.keyslot(name)
            return self._redis.nodes_manager.get_node_from_slot(slot).name
        except (RedisClusterException, LookupError):  # no slot map yet
            return f"(no node for slot of {name[:24]!r})"

    async def _groups(self, names: Sequence[bytes]) -> list[tuple[Node, list[int]]]:
        """Indexes of `names` grouped by the node owning their slot (one group of all on
        one node). A slot no node covers gets a group of its own, to fail alone."""
        if not self._cluster:
            return [(None, list(range(len(names))))]
        with self._guard():
            await self._redis.initialize()  # a no-op once the slot map is known
        groups: dict[str, tuple[Node, list[int]]] = {}
        for index, name in enumerate(names):
            slot = self._redis.keyslot(name)
            try:
                node = self._redis.nodes_manager.get_node_from_slot(slot)
                label = node.name
            except RedisClusterException:
                node, label = None, f"uncovered:{slot}"
            groups.setdefault(label, (node, []))[1].append(index)
        return list(groups.values())

    async def _per_node(
        self,
        names: Sequence[bytes],
        run: Callable[[Node, list[int]], Awaitable[list]],
    ) -> tuple[list, StoreUnavailable | None]:
        """Run `run(node, indexes)` for each node's group concurrently; return the
        per-name results (None where a group failed) and the first failure, if any."""
        groups = await self._groups(names)
        answers = await asyncio.gather(
            *(self._guarded(run, node, indexes, names) for node, indexes in groups),
            return_exceptions=True,
        )
        out: list = [None] * len(names)
        failure = None
        for (_, indexes), answer in zip(groups, answers, strict=True):
            if isinstance(answer, StoreUnavailable):
                failure = failure or answer
                continue
            if isinstance(answer, BaseException):
                raise answer
            for index, value in zip(indexes, answer, strict=True):
                out[index] = value
        return out, failure

    async def _guarded(self, run, node: Node, indexes: list[int], names) -> list:
        if self._cluster and node is None:  # an uncovered slot
            raise self._unavailable("has no node", RedisClusterException(), names[indexes[0]])
        with self._guard(names[indexes[0]]):
            return await run(node, indexes)

    async def _on_node(self, node: Node, *command):
        """One command on `node` (None: the only node, or routed by its keys)."""
        if node is None:
            return await self._redis.execute_command(*command)
        return await self._redis.execute_command(*command, target_nodes=node)

    # --- writes and reads ------------------------------------------------------------
    async def put(self, key: bytes, header: Header, data: bytes | bytearray) -> None:
        name = self._entry(key)
        with self._guard(name):
            # One slot (shared hash tag), so MULTI works on a cluster too.
            async with self._redis.pipeline(transaction=True) as pipe:
                # SET then APPEND inside MULTI: the tensor bytes go to the socket as they
                # are, without being joined to the prefix in Python first.
                pipe.set(name, fmt.pack_embedding_prefix(header), px=self._ttl_ms or None)
                pipe.append(name, data)
                pipe.delete(self._lease(key), self._failure(key, header.token_count))
                await pipe.execute()

    async def fail(self, key: bytes, token_count: int, reason: str) -> None:
        name = self._failure(key, token_count)
        with self._guard(name):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(name, reason.encode(), px=self._failed_ttl_ms)
                pipe.delete(self._lease(key))
                await pipe.execute()

    async def open(
        self, key: bytes, chunk_bytes: int, token_count: int = 0
    ) -> Reading | Failed | None:
        name = self._entry(key)
        with self._guard(name):
            # The first read covers preamble, header and one whole read of data, so an
            # entry of up to `read_bytes` costs a single round trip.
            first = await self._redis.getrange(name, 0, self._read_bytes + FIRST_READ_SLACK - 1)
        reading = None
        if first:
            reading = await self._reading(key, name, first, chunk_bytes)
        if reading is not None and token_count and reading.header.token_count != token_count:
            reading = None  # another count: no answer for this caller, kept for the others
        if reading is not None:
            return reading
        failure = self._failure(key, token_count)
        with self._guard(failure):
            reason = await self._redis.get(failure)
        return None if reason is None else Failed(reason.decode(errors="replace"))

    async def _reading(self, key: bytes, name: bytes, first: bytes, chunk_bytes: int):
        try:
            kind, _, length = fmt.unpack_prefix(first)
        except fmt.CorruptEntry:
            await self.delete([key])
            return None
        body = fmt.PREAMBLE_BYTES + length
        if kind != fmt.KIND_EMBEDDING:
            return None  # a failure in the entry key: the layout of an older version
        if len(first) < body:  # a header longer than the slack cannot be written by put
            await self.delete([key])
            return None
        header = header_from_stored(fmt.parse_header(first[fmt.PREAMBLE_BYTES : body]))
        return Reading(header, self._chunks(name, first, body, header.nbytes, chunk_bytes))

    async def discard(self, key: bytes, header: Header) -> bool:
        name = self._entry(key)
        with self._guard(name):
            deleted = await self._redis.execute_command(
                "EVAL", _DISCARD_SCRIPT, 1, name, fmt.pack_embedding_prefix(header)
            )
        return bool(deleted)

    async def _chunks(
        self, name: bytes, first: bytes, start: int, nbytes: int, chunk_bytes: int
    ) -> AsyncIterator[bytes]:
        """The data as pieces of at most chunk_bytes. Redis is read in ranges of
        `read_bytes`, the next ones in flight while the current one is sent on."""
        end = start + nbytes  # exclusive
        offset = min(len(first), end)
        for piece in _pieces(memoryview(first)[start:offset], chunk_bytes):
            yield piece
        step = self._read_bytes
        ranges = [(lo, min(lo + step, end)) for lo in range(offset, end, step)]
        inflight: list[asyncio.Task] = []
        try:
            for index, (lo, hi) in enumerate(ranges):
                for a, b in ranges[index + len(inflight) : index + self._prefetch]:
                    inflight.append(asyncio.ensure_future(self._redis.getrange(name, a, b - 1)))
                with self._guard(name):
                    read = await inflight.pop(0)
                if len(read) != hi - lo:
                    raise EntryVanished(f"entry shrank mid-read at byte {lo}")
                for piece in _pieces(memoryview(read), chunk_bytes):
                    yield piece
        finally:
            for task in inflight:
                task.cancel()

    # --- batches ---------------------------------------------------------------------
    async def _delete_names(self, names: list[bytes]) -> int:
        async def run(node: Node, indexes: list[int]) -> list[int]:
            # DEL of several slots is split per slot by the cluster client.
            return [int(await self._redis.delete(*[names[i] for i in indexes]))] + [0] * (
                len(indexes) - 1
            )

        counts, failure = await self._per_node(names, run)
        if failure is not None:
            raise failure
        return sum(counts)

    async def delete(self, keys: Sequence[bytes]) -> int:
        return await self._delete_names([self._entry(key) for key in keys]) if keys else 0

    async def abandon(self, keys: Sequence[bytes]) -> int:
        return await self._delete_names([self._lease(key) for key in keys]) if keys else 0

    async def exists(self, keys: Sequence[bytes]) -> list[bool]:
        if not keys:
            return []
        names = [self._entry(key) for key in keys]

        async def run(node: Node, indexes: list[int]) -> list[bool]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for index in indexes:
                    pipe.getrange(names[index], 0, fmt.PREAMBLE_BYTES - 1)
                heads = await pipe.execute()
            return [_is_embedding(head) for head in heads]

        present, failure = await self._per_node(names, run)
        if failure is not None:
            raise failure
        return present

    async def _run_script(
        self, items: Sequence[tuple[bytes, int]], lease_ms: int, take_over: bool = False
    ) -> list[ItemState]:
        if not items:
            return []
        names = [self._entry(key) for key, _ in items]

        async def run(node: Node, indexes: list[int]) -> list[ItemState]:
            if len(indexes) == 1:
                node = None  # declared keys of one slot: the client follows redirects
            try:
                return await self._script(node, [items[i] for i in indexes], lease_ms, take_over)
            except (*_REDIRECTS, ResponseError) as err:
                moved = isinstance(err, _REDIRECTS) or _NOT_LOCAL in str(err)
                if node is None or not moved:
                    raise
            # A slot moved off the node since the map was read: one routed call per item,
            # whose redirects the cluster client follows.
            return [(await self._script(None, [items[i]], lease_ms, take_over))[0] for i in indexes]

        states, failure = await self._per_node(names, run)
        if failure is not None:
            if lease_ms:  # leases this call took on healthy nodes would strand waiters
                taken = [
                    key
                    for (key, _), state in zip(items, states, strict=True)
                    if state is not None and state.status == Status.RESERVED
                ]
                with contextlib.suppress(StoreUnavailable):
                    await self.abandon(taken)
            raise failure
        return states

    async def _script(
        self, node: Node, items: Sequence[tuple[bytes, int]], lease_ms: int, take_over: bool
    ) -> list[ItemState]:
        """The state script over `items`: declared keys routed by their slot when `node`
        is None (one node, or one item), else names in ARGV on that node."""
        names: list[bytes] = []
        args: list[bytes | int] = [lease_ms, self._owner, int(take_over), len(items)]
        for key, token_count in items:
            names += [self._entry(key), self._lease(key), self._failure(key, token_count)]
            args.append(fmt.token_count_bytes(token_count) if token_count else b"")
        if node is None:
            replies = await self._on_node(None, "EVAL", _STATE_SCRIPT, len(names), *names, *args)
        else:
            replies = await self._on_node(node, "EVAL", _STATE_SCRIPT, 0, *args, *names)
        return [_decode_state(reply) for reply in replies]

    async def reserve(
        self, items: Sequence[tuple[bytes, int]], lease_ms: int, take_over: bool = False
    ) -> list[ItemState]:
        return await self._run_script(items, max(1, lease_ms), take_over)

    async def probe(self, items: Sequence[tuple[bytes, int]]) -> list[ItemState]:
        return await self._run_script(items, 0)

    # --- the whole store -------------------------------------------------------------
    async def _masters(self) -> list[Node]:
        if not self._cluster:
            return [None]
        with self._guard():
            await self._redis.initialize()
        return self._redis.get_primaries()

    async def _node_stats(self, node: Node) -> tuple[int, dict, dict]:
        entries = await self._on_node(node, "DBSIZE")
        memory = await self._on_node(node, "INFO", "memory")
        stats = await self._on_node(node, "INFO", "stats")
        return int(entries), memory, stats

    async def stats(self) -> StoreStats:
        """Sums over the masters that answer (a cluster with one master down still
        reports the rest); StoreUnavailable when none does."""
        masters = await self._masters()
        answers = await asyncio.gather(
            *(self._node_stats(node) for node in masters), return_exceptions=True
        )
        good = [a for a in answers if not isinstance(a, BaseException)]
        if not good:
            with self._guard():
                raise answers[0]
        return StoreStats(
            entries=sum(entries for entries, _, _ in good),
            bytes=sum(int(memory.get("used_memory", 0)) for _, memory, _ in good),
            capacity_bytes=sum(int(memory.get("maxmemory", 0)) for _, memory, _ in good),
            evictions=sum(int(stats.get("evicted_keys", 0)) for _, _, stats in good),
        )

    async def ping(self) -> None:
        """On a cluster: some master answers (one down master is a failover in progress,
        not a reason to take the whole service out of rotation)."""
        masters = await self._masters()
        answers = await asyncio.gather(
            *(self._on_node(node, "PING") for node in masters), return_exceptions=True
        )
        if all(isinstance(answer, BaseException) for answer in answers):
            with self._guard():
                raise answers[0]

    async def close(self) -> None:
        await self._redis.aclose()


def _is_embedding(head: bytes) -> bool:
    try:
        return fmt.unpack_prefix(head)[0] == fmt.KIND_EMBEDDING
    except fmt.CorruptEntry:
        return False


def _pieces(view: memoryview, chunk_bytes: int) -> Iterator[bytes]:
    """One Redis read as gRPC messages of at most chunk_bytes (smaller than the read:
    messages under glibc's mmap threshold reuse heap memory instead of faulting in fresh
    pages on every send, which was most of the service's cost of a 1 MiB message)."""
    for lo in range(0, len(view), chunk_bytes):
        yield bytes(view[lo : lo + chunk_bytes])


def _decode_state(reply: bytes) -> ItemState:
    if reply == b"P":
        return ItemState(Status.PRESENT)
    if reply.startswith(b"F"):
        return ItemState(Status.FAILED, reply[1:].decode(errors="replace"))
    if reply == b"R":
        return ItemState(Status.RESERVED)
    if reply == b"W":
        return ItemState(Status.PENDING)
    return ItemState(Status.FREE)
