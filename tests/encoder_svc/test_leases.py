"""The encoder's failures and slowness are the cache's business (issue 34, item 2): a put
the cache refuses gives the lease back (503 material, not a failed image), and the
encoder holds the lease for as long as it works, whatever lease the gateway took.

Real cache and encoder services on loopback. The encode is held by the runner's gate (a
deterministic hook), and the lease is short so that the test waits little; what the test
waits for is a count of lease renewals, never a duration."""

from __future__ import annotations

import asyncio

from embedding_cache_svc.client import Status
from tests.encoder_svc.stack import encode_item, png


async def _until(predicate, what: str, tries: int = 2000) -> None:
    for _ in range(tries):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def test_a_put_the_cache_refuses_abandons_the_lease_and_is_retryable(qwen, stack_factory):
    # A memory store smaller than one embedding: every Put is refused (INVALID_ARGUMENT).
    stack = await stack_factory(qwen, cache_settings={"memory_bytes": 1024})
    item = encode_item(qwen, png(31, 96, 96))
    key, count = item.item.identity, item.item.token_count
    # The gateway's lease, long: before the change it blocked the image for all of it.
    assert await stack.cache_client.reserve([(key, count)], 30_000) == [Status.RESERVED]
    reply = await stack.encode([item])
    (result,) = reply.results
    assert not result.ok and result.retryable
    assert "cache put failed" in result.error and "capacity" in result.error
    # No failed entry, no lease: the next request may try again at once.
    assert await stack.cache_client.wait([(key, count)], 0) == {key: Status.FREE}
    assert await stack.cache_client.reserve([(key, count)], 1000) == [Status.RESERVED]


async def test_the_encoder_holds_the_lease_while_it_works(qwen, stack_factory):
    stack = await stack_factory(qwen, lease_ms=600)
    item = encode_item(qwen, png(32, 96, 96))
    key, count = item.item.identity, item.item.token_count
    # The gateway's lease is far shorter than the encode will take.
    assert await stack.cache_client.reserve([(key, count)], 50) == [Status.RESERVED]
    stack.runner.gate.clear()
    encode = asyncio.ensure_future(stack.encode([item]))
    await asyncio.to_thread(stack.runner.entered.wait, 30)
    batcher = stack.encoder.batcher
    # Four renewals, a third of the lease apart: past the gateway's lease and past the
    # encoder's own first one. The item is still leased (PENDING), never FREE ("missing").
    await _until(lambda: batcher.lease_renewals >= 4, "four lease renewals")
    assert await stack.cache_client.wait([(key, count)], 0) == {key: Status.PENDING}
    stack.runner.gate.set()
    (result,) = (await encode).results
    assert result.ok
    assert await stack.cache_client.wait([(key, count)], 0) == {key: Status.PRESENT}
