"""Store-level behaviour that the service tests do not reach: TTLs, and Redis key layout."""

from __future__ import annotations

from embedding_cache_svc.entry import Failed, Header, Status
from embedding_cache_svc.store.memory import MemoryStore
from tests.embedding_cache_svc.helpers import (
    FINGERPRINT,
    entry_name,
    failure_name,
    new_key,
    raw_redis,
)

HEADER = Header(2, 2, "float32", 0, FINGERPRINT)


async def test_memory_store_expires_entries_failures_and_leases():
    now = [1000.0]  # the store's clock, moved by hand: no outcome rests on the machine's speed
    store = MemoryStore(1 << 20, ttl_s=0.05, failed_ttl_s=0.05, clock=lambda: now[0])
    entry_key, failed_key, leased_key = (FINGERPRINT + new_key() for _ in range(3))
    await store.put(entry_key, HEADER, bytearray(16))
    await store.fail(failed_key, 2, "bad image")
    assert [s.status for s in await store.reserve([(leased_key, 2)], 50)] == [Status.RESERVED]
    assert isinstance(await store.open(failed_key, 1024, 2), Failed)
    assert [s.status for s in await store.probe([(entry_key, 2)])] == [Status.PRESENT]
    now[0] += 0.1
    assert await store.open(entry_key, 1024) is None
    assert await store.open(failed_key, 1024, 2) is None
    assert [s.status for s in await store.probe([(leased_key, 2)])] == [Status.FREE]
    assert (await store.stats()).bytes == 0


async def test_memory_store_forgets_the_leases_of_holders_that_never_came_back():
    """Leases whose holders died (never Put, Failed nor Abandoned, keys never asked for
    again) are dropped once expired, not kept for the process's life. (The count is read
    from the store's private table: no wire call shows it.)"""
    now = [1000.0]
    store = MemoryStore(1 << 20, ttl_s=0, failed_ttl_s=1, clock=lambda: now[0])
    dead = [(FINGERPRINT + new_key(), 2) for _ in range(50)]
    await store.reserve(dead, 50)
    now[0] += 0.1
    alive = FINGERPRINT + new_key()
    assert [s.status for s in await store.reserve([(alive, 2)], 50)] == [Status.RESERVED]
    assert list(store._leases) == [alive]


def test_redis_entries_carry_ttls_and_failures_the_short_one(shared_service):
    settings = shared_service.server.settings
    entry_key, failed_key = FINGERPRINT + new_key(), FINGERPRINT + new_key()
    shared_service.call(shared_service.store.put(entry_key, HEADER, bytearray(16)))
    shared_service.call(shared_service.store.fail(failed_key, 2, "bad image"))
    raw = raw_redis(settings)
    try:
        entry_ttl = raw.pttl(entry_name(settings, entry_key))
        failed_ttl = raw.pttl(failure_name(settings, failed_key, 2))
    finally:
        raw.close()
    assert settings.failed_ttl_s * 1000 >= failed_ttl > 0
    assert settings.ttl_s * 1000 >= entry_ttl > settings.failed_ttl_s * 1000
