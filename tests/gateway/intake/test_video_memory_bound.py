"""The gateway-wide bound on decoded video bytes in flight (gateway/intake/video_memory.py):
what fits is taken at once, what does not waits in turn and is granted when a holder's
frames are freed (from any thread), and a wait that runs out is a 503 with Retry-After,
counted by setting."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from gateway.errors import APIError
from gateway.intake.video_memory import VideoMemory


def _refusals(setting: str) -> float:
    value = REGISTRY.get_sample_value("iris_gateway_video_refusals_total", {"setting": setting})
    return value or 0.0


class Frames:
    """Stands for a sampled video: what a reservation is held with."""


def test_a_reservation_waits_until_a_holders_frames_are_freed_on_another_thread():
    async def scenario():
        memory = VideoMemory(100, timeout_s=60)
        first = await memory.reserve(90, "a")
        frames = Frames()
        first.hold_part(frames, 80)
        first.release()  # what the frames did not take
        waiting = asyncio.ensure_future(memory.reserve(50, "b"))
        await asyncio.sleep(0)
        assert not waiting.done() and memory.used == 80
        holder = [frames]
        del frames
        # The last reference goes on a worker thread, as a request's prompt may.
        await asyncio.to_thread(holder.clear)
        second = await waiting
        assert memory.used == 50
        kept = Frames()
        second.hold_part(kept, 20)
        second.release()
        assert memory.used == 20
        del kept
        assert memory.used == 0 or await _released(memory)
        assert memory.used == 0

    asyncio.run(scenario())


async def _released(memory: VideoMemory) -> bool:
    """The finalizer hands the bytes back on the loop: let it run."""
    async with asyncio.timeout(60):
        while memory.used:
            await asyncio.sleep(0)
    return True


def test_a_wait_that_runs_out_is_a_503_with_retry_after():
    async def scenario():
        memory = VideoMemory(100, timeout_s=0, retry_after_s=3)
        held = await memory.reserve(60, "a")
        before = _refusals("video_queue_timeout_s")
        with pytest.raises(APIError) as refused:
            await memory.reserve(60, "b")
        assert refused.value.status == 503
        assert refused.value.retry_after == 3
        message = refused.value.message
        assert "video_max_inflight_bytes" in message
        assert "need 60 bytes" in message and "60 of the limit of 100 bytes" in message
        assert _refusals("video_queue_timeout_s") == before + 1
        assert memory.used == 60 and not memory._waiting
        held.release()
        assert (await memory.reserve(100, "c")).nbytes == 100

    asyncio.run(scenario())


def test_more_than_the_whole_bound_is_a_400():
    async def scenario():
        memory = VideoMemory(100, timeout_s=60)
        with pytest.raises(APIError) as refused:
            await memory.reserve(101, "messages[0].content[1]")
        assert refused.value.status == 400
        assert "(video_max_inflight_bytes)" in refused.value.message

    asyncio.run(scenario())


def test_waiters_are_served_in_turn():
    async def scenario():
        memory = VideoMemory(100, timeout_s=60)
        first = await memory.reserve(95, "a")
        big = asyncio.ensure_future(memory.reserve(90, "big"))
        await asyncio.sleep(0)
        small = asyncio.ensure_future(memory.reserve(5, "small"))
        await asyncio.sleep(0)
        assert not big.done() and not small.done()  # small would fit, but big came first
        first.release()
        await asyncio.gather(big, small)
        assert memory.used == 95

    asyncio.run(scenario())
