"""The encoder's gRPC health is readiness: NOT_SERVING while its tower is stuck on a batch
(held by the test's gate), SERVING again once the batch ends, NOT_SERVING at shutdown;
/healthz (liveness) stays 200 while the batch loop runs. Real encoder and cache services."""

from __future__ import annotations

import asyncio

import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.encoder_svc.stack import encode_item, png

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def status(stack) -> int:
    stub = health_pb2_grpc.HealthStub(stack.channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service="iris.encoder.Encoder"))
    return reply.status


async def until(condition, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_a_stuck_batch_turns_the_encoder_not_serving_until_it_ends(qwen, stack_factory):
    stack = await stack_factory(qwen, max_wait_ms=1, batch_stall_s=0.2, health_interval_s=0.05)
    assert await status(stack) == SERVING
    stack.runner.gate.clear()
    work = asyncio.ensure_future(stack.encode([encode_item(qwen, png(5, 64, 48))]))
    await asyncio.to_thread(stack.runner.entered.wait, 30)

    async def not_serving() -> bool:
        return await status(stack) == NOT_SERVING

    await until(not_serving)
    health = f"http://127.0.0.1:{stack.encoder.metrics_port}/healthz"
    reply = await asyncio.to_thread(httpx.get, health, timeout=5)
    assert (
        reply.status_code == 200 and "the batch loop has made no progress" in reply.json()["reason"]
    )

    stack.runner.gate.set()
    assert all(result.ok for result in (await work).results)

    async def serving() -> bool:
        return await status(stack) == SERVING

    await until(serving)
    await stack.encoder.stop(grace_s=0)
    stack.stopped = True
