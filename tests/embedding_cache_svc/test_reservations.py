"""Reserve is atomic per item; Wait releases on Put, on Fail (with the reason) and when a
lease expires."""

from __future__ import annotations

import asyncio
import threading
import time

import torch

from embedding_cache_svc.client import AsyncCacheClient, CacheClient, Failed, Status
from tests.embedding_cache_svc.helpers import (
    FINGERPRINT,
    ServerThread,
    make_settings,
    new_key,
    redis_target,
)

CONTENDERS = 12


async def _reserve_concurrently(addresses: list[str], key: bytes) -> list:
    clients = [
        AsyncCacheClient(addresses[i % len(addresses)], FINGERPRINT) for i in range(CONTENDERS)
    ]
    try:
        # One channel per contender, all connected first, so the Reserves really race.
        await asyncio.gather(*(client.exists([key]) for client in clients))
        results = await asyncio.gather(*(client.reserve([(key, 4)], 5000) for client in clients))
    finally:
        await asyncio.gather(*(client.close() for client in clients))
    return [states[0] for states in results]


async def test_concurrent_reserve_of_one_item_gives_exactly_one_lease(service):
    states = await _reserve_concurrently([service.address], new_key())
    assert states.count(Status.RESERVED) == 1
    assert states.count(Status.PENDING) == CONTENDERS - 1


async def test_reserve_is_atomic_across_replicas_sharing_redis(shared_service):
    # A second service replica on the same Redis (same key prefix): one lease in total.
    settings = shared_service.server.settings
    other = ServerThread(
        make_settings(
            settings.store, redis_target(settings), redis_key_prefix=settings.redis_key_prefix
        )
    )
    try:
        states = await _reserve_concurrently([shared_service.address, other.address], new_key())
    finally:
        other.close()
    assert states.count(Status.RESERVED) == 1
    assert states.count(Status.PENDING) == CONTENDERS - 1


def test_reserve_states_per_item(service):
    with CacheClient(service.address, FINGERPRINT) as client:
        present, failed, leased = new_key(), new_key(), new_key()
        client.put(present, torch.ones(2, 4), 2)
        client.fail(failed, "too many pixels: 9000x9000 > limit 4096x4096", 2)
        assert client.reserve([(leased, 3)], 5000) == [Status.RESERVED]
        states = client.reserve([(present, 2), (failed, 2), (leased, 3), (new_key(), 1)], 5000)
        assert states == [
            Status.PRESENT,
            Failed("too many pixels: 9000x9000 > limit 4096x4096"),
            Status.PENDING,
            Status.RESERVED,
        ]


def _wait_in_thread(address: str, items, deadline_s: float) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        with CacheClient(address, FINGERPRINT) as client:
            out.update(client.wait(items, deadline_s))

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def until_waiting(service: ServerThread, count: int) -> None:
    """Return once `count` Wait calls are inside the service, so a test's release lands on
    a waiter that is really waiting (not before it arrived)."""
    for _ in range(1000):
        if service.server.servicer.waiting >= count:
            return
        time.sleep(0.005)
    raise AssertionError(f"{count} waiters never arrived")


def test_waiters_are_released_by_put_and_by_fail(service):
    with CacheClient(service.address, FINGERPRINT) as producer:
        put_key, fail_key = new_key(), new_key()
        assert producer.reserve([(put_key, 2), (fail_key, 2)], 30_000) == [Status.RESERVED] * 2
        first, first_out = _wait_in_thread(service.address, [(put_key, 2)], 30)
        second, second_out = _wait_in_thread(service.address, [(fail_key, 2)], 30)
        until_waiting(service, 2)
        producer.put(put_key, torch.ones(2, 4), 2)
        producer.fail(fail_key, "not an image: unknown format", 2)
        first.join(10)
        second.join(10)
    # A release returns before the 30 s deadline, so a still-leased item cannot show up.
    assert first_out == {put_key: Status.PRESENT}
    assert second_out == {fail_key: Failed("not an image: unknown format")}


def test_waiters_are_released_when_the_lease_expires(service):
    with CacheClient(service.address, FINGERPRINT) as client:
        key = new_key()
        assert client.reserve([(key, 2)], 300) == [Status.RESERVED]  # its writer "dies"
        assert client.wait([(key, 2)], 20) == {key: Status.FREE}
        assert client.reserve([(key, 2)], 5000) == [Status.RESERVED]


def test_an_abandoned_lease_frees_its_waiters_and_the_next_reserve(service):
    with CacheClient(service.address, FINGERPRINT) as client:
        key, stored = new_key(), new_key()
        client.put(stored, torch.ones(2, 4), 2)
        assert client.reserve([(key, 2)], 30_000) == [Status.RESERVED]
        waiter, out = _wait_in_thread(service.address, [(key, 2)], 30)
        until_waiting(service, 1)
        assert client.abandon([key, stored]) == 1  # one live lease; the entry is not a lease
        waiter.join(10)
        assert out == {key: Status.FREE}  # before the 30 s lease or wait deadline
        assert client.reserve([(key, 2), (stored, 2)], 5000) == [Status.RESERVED, Status.PRESENT]


def test_wait_returns_pending_at_its_deadline(service):
    with CacheClient(service.address, FINGERPRINT) as client:
        key, free = new_key(), new_key()
        client.reserve([(key, 2)], 30_000)
        assert client.wait([(key, 2), (free, 2)], 0.2) == {key: Status.PENDING, free: Status.FREE}


async def test_async_wait_sees_a_put_from_another_client(service):
    key = new_key()
    async with (
        AsyncCacheClient(service.address, FINGERPRINT) as a,
        AsyncCacheClient(service.address, FINGERPRINT) as b,
    ):
        assert await a.reserve([(key, 3)], 30_000) == [Status.RESERVED]
        waiter = asyncio.create_task(b.wait([(key, 3)], 30))
        while service.server.servicer.waiting < 1:
            await asyncio.sleep(0.005)
        await a.put(key, torch.zeros(3, 4), 3)
        assert await waiter == {key: Status.PRESENT}
        got = await b.get_many([(key, 3)], 4, torch.float32)
        assert torch.equal(got[key], torch.zeros(3, 4))


def test_wait_without_token_count_check(service):
    with CacheClient(service.address, FINGERPRINT) as client:
        key = new_key()
        client.put(key, torch.ones(2, 4), 2)
        assert client.wait([(key, 0)], 1) == {key: Status.PRESENT}
        assert client.wait([(key, 3)], 1) == {key: Status.FREE}  # stale: discarded


def test_take_over_leases_a_leased_item_to_the_caller(service):
    with CacheClient(service.address, FINGERPRINT) as gateway:
        key, stored = new_key(), new_key()
        gateway.put(stored, torch.ones(2, 4), 2)
        assert gateway.reserve([(key, 2)], 50) == [Status.RESERVED]
        # The encoder takes the gateway's short lease over with its own, longer one.
        taken = gateway.reserve([(key, 2), (stored, 2)], 30_000, take_over=True)
        assert taken == [Status.RESERVED, Status.PRESENT]
        assert gateway.reserve([(key, 2)], 1000) == [Status.PENDING]
        assert gateway.abandon([key]) == 1
        assert gateway.reserve([(key, 2)], 1000) == [Status.RESERVED]
