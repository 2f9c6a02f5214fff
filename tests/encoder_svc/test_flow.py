"""Flow control: a full queue refuses with a retry hint, a cancelled caller does not cancel
work others share, and a stopping encoder fails its in-flight items in the cache."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from embedding_cache_svc.client import Failed
from encoder_svc.batcher import SHUTDOWN_REASON
from iris.metrics import ENCODER_REJECTED
from tests.encoder_svc.stack import encode_item, png


async def _until(predicate, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


async def _in_tower(stack) -> None:
    await _until(stack.runner.entered.is_set)


def _tokens(*items) -> int:
    return sum(item.item.token_count for item in items)


async def test_full_queue_is_refused_with_a_retry_hint(qwen, stack_factory):
    a, b, c = (encode_item(qwen, png(seed, 200, 120)) for seed in (21, 22, 23))
    limit = _tokens(a, b)
    stack = await stack_factory(
        qwen, max_wait_ms=1, max_queue_vision_tokens=limit, max_item_vision_tokens=limit
    )
    stack.runner.gate.clear()
    first = asyncio.ensure_future(stack.encode([a]))
    await _in_tower(stack)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.encode([b, c])
    error = refused.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"{_tokens(b, c)} new vision tokens with {_tokens(a)} queued" in error.details()
    assert f"limit of {limit}" in error.details()
    retry = dict(error.trailing_metadata())["retry-after-ms"]
    assert int(retry) > 0
    registry = stack.encoder.metrics.registry
    assert registry.get_sample_value(ENCODER_REJECTED) == 1

    # What fits is admitted, and a duplicate of work in flight costs nothing.
    second = asyncio.ensure_future(stack.encode([b, a]))
    await _until(lambda: stack.encoder.batcher.queued() == (2, limit))
    stack.runner.gate.set()
    replies = await asyncio.gather(first, second)
    assert all(r.ok for reply in replies for r in reply.results)
    assert sum(stack.runner.calls) == 2
    assert stack.encoder.batcher.queued() == (0, 0)


async def test_item_larger_than_the_queue_is_invalid(qwen, stack_factory):
    item = encode_item(qwen, png(24, 200, 120))
    limit = item.item.token_count - 1
    stack = await stack_factory(qwen, max_queue_vision_tokens=limit, max_item_vision_tokens=limit)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.encode([item])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"token_count {item.item.token_count} is over the limit of {limit}" in (
        refused.value.details()
    )


async def test_cancelled_caller_does_not_cancel_shared_work(qwen, stack_factory):
    stack = await stack_factory(qwen, max_wait_ms=1)
    item = encode_item(qwen, png(31, 160, 160))
    key = (item.item.identity, item.item.token_count)
    stack.runner.gate.clear()
    leaving = stack.stub.Encode(stack.request([item]))
    await _in_tower(stack)
    staying = asyncio.ensure_future(stack.encode([item]))
    await _until(lambda: stack.encoder.metrics._submitted == 2)  # the second caller joined
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    stack.runner.gate.set()
    reply = await asyncio.wait_for(staying, 60)
    assert reply.results[0].ok
    assert stack.runner.calls == [1]
    stored = await stack.cache_client.get_many([key], 64, torch.float32)
    assert isinstance(stored[item.item.identity], torch.Tensor)


async def test_work_of_a_lone_cancelled_caller_still_lands_in_the_cache(qwen, stack_factory):
    stack = await stack_factory(qwen, max_wait_ms=1)
    item = encode_item(qwen, png(32, 100, 180))
    key = (item.item.identity, item.item.token_count)
    stack.runner.gate.clear()
    call = stack.stub.Encode(stack.request([item]))
    await _in_tower(stack)
    call.cancel()
    stack.runner.gate.set()
    states = await stack.cache_client.wait([key], deadline_s=30)
    assert states[item.item.identity] == 1  # PRESENT


async def test_stopping_encoder_fails_in_flight_items_in_the_cache(qwen, stack_factory):
    stack = await stack_factory(qwen, max_wait_ms=1)
    running, queued = (encode_item(qwen, png(seed, 120, 120)) for seed in (41, 42))
    stack.runner.gate.clear()
    first = asyncio.ensure_future(stack.encode([running]))
    await _in_tower(stack)
    second = asyncio.ensure_future(stack.encode([queued]))
    await _until(lambda: stack.encoder.batcher.queued()[0] == 2)

    await stack.encoder.stop(grace_s=0)
    stack.stopped = True
    for reply in await asyncio.gather(first, second):
        assert not reply.results[0].ok
        assert reply.results[0].error == SHUTDOWN_REASON
    keys = [(item.item.identity, item.item.token_count) for item in (running, queued)]
    stored = await stack.cache_client.get_many(keys, 64, torch.float32)
    assert stored[running.item.identity] == Failed(SHUTDOWN_REASON)
    assert stored[queued.item.identity] == Failed(SHUTDOWN_REASON)
