"""A large body kept in shared memory as it arrives (gateway/parsing/shared_body.py): the
chunks land in one segment in order, a small body stays a joined `bytes`, and the segment is
gone once released."""

from __future__ import annotations

import asyncio
import contextlib
import os
from multiprocessing.shared_memory import SharedMemory

import pytest

from gateway.parsing.shared_body import BodyBuffer, SharedBody, page_rounded

MIB = 1024 * 1024
SHM = "/dev/shm"


async def test_past_the_spill_size_the_chunks_land_in_one_segment_in_order():
    buffer = BodyBuffer(spill_over=10, max_bytes=100)
    chunks = [b"0123456", b"789abc", b"defg", b"", b"hij"]
    for chunk in chunks:
        await buffer.add(chunk)
    body = buffer.body()
    assert isinstance(body, SharedBody)
    assert body.size == len(b"".join(chunks))
    assert body.to_bytes() == b"".join(chunks)
    name = body.name
    buffer.release()
    with pytest.raises(FileNotFoundError):
        SharedMemory(name=name)


async def test_a_small_body_or_no_spill_size_stays_in_memory():
    for spill_over in (10, None):
        buffer = BodyBuffer(spill_over=spill_over, max_bytes=100)
        for chunk in (b"abc", b"def") if spill_over else (b"x" * 60, b"y" * 30):
            await buffer.add(chunk)
        assert isinstance(buffer.body(), bytes)


async def test_a_dropped_body_leaves_no_segment():
    buffer = BodyBuffer(spill_over=4, max_bytes=100)
    await buffer.add(b"0123456789")
    shared = buffer.body()
    assert isinstance(shared, SharedBody)
    buffer.drop()
    assert buffer.body() == b""
    with pytest.raises(FileNotFoundError):
        SharedMemory(name=shared.name)


async def test_a_chunk_past_the_capacity_is_not_written():
    body = await SharedBody.create(8)
    assert body is not None
    try:
        assert body.write(b"12345")
        assert not body.write(b"6789")
        assert body.to_bytes() == b"12345"
    finally:
        body.release()


async def test_a_worker_reads_the_body_from_its_segment_and_leaves_a_large_outcome_in_one():
    """parse_shared (run here in this process, as a worker would) reads the body from the
    segment; a large outcome is left in a segment of its own, read back and removed by
    unpack_shared; a small one travels inline."""
    import json

    from gateway.api.schemas import CompletionRequest
    from gateway.parsing.transport import unpack, unpack_shared
    from gateway.parsing.worker import parse_shared

    for prompt, inline in (("hi", True), (list(range(60_000)), False)):
        raw = json.dumps({"model": "m", "prompt": prompt}).encode()
        body = await SharedBody.create(len(raw))
        assert body is not None
        try:
            for at in range(0, len(raw), 4096):
                assert body.write(raw[at : at + 4096])
            result = parse_shared(CompletionRequest, body.name, body.size)
        finally:
            body.release()
        assert isinstance(result, bytes) is inline
        kind, value = unpack(result) if inline else unpack_shared(*result)
        assert kind == "model"
        assert value == CompletionRequest.model_validate(json.loads(raw))
        if not inline:
            with pytest.raises(FileNotFoundError):
                SharedMemory(name=result[0])


async def test_a_segment_is_sized_from_the_content_length_rounded_to_a_page():
    buffer = BodyBuffer(spill_over=10, max_bytes=16 * MIB, expected=5000)
    await buffer.add(b"x" * 5000)
    body = buffer.body()
    assert isinstance(body, SharedBody) and body.capacity == page_rounded(5000) == 8192
    buffer.release()


async def test_without_a_length_the_segment_doubles_from_1_mib_up_to_the_limit():
    limit = 3 * MIB + 1
    buffer = BodyBuffer(spill_over=10, max_bytes=limit)
    chunk = bytes(range(256)) * 1024  # 256 KiB
    capacities, names = [], set()
    for _ in range(12):  # 3 MiB
        await buffer.add(chunk)
        capacities.append(buffer.body().capacity)
        names.add(buffer.body().name)
    await buffer.add(b"!")  # the last byte the limit allows
    body = buffer.body()
    assert sorted(set(capacities)) == [MIB, 2 * MIB, page_rounded(limit)]
    assert body.capacity == page_rounded(limit) and body.to_bytes() == chunk * 12 + b"!"
    buffer.release()
    for name in names:  # the outgrown segments were removed as they were replaced
        with pytest.raises(FileNotFoundError):
            SharedMemory(name=name)


async def test_a_body_is_released_once():
    body = await SharedBody.create(10)
    body.release()
    body.release()  # the route and the door both release it: the second does nothing


def own_segments() -> set[str]:
    """The /dev/shm segments this process has open (other test workers make their own)."""
    names = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(SHM + "/"):
                names.add(os.path.basename(target))
    return names


async def test_a_body_cancelled_while_it_grows_leaves_no_new_segment():
    """The request goes away while its body moves to a bigger segment (its pages being
    reserved, or the body being copied a window at a time): that segment is removed."""
    body = await SharedBody.create(3 * MIB)
    assert body is not None and body.write(b"x" * 3 * MIB)
    before = own_segments()
    growing = asyncio.ensure_future(body.grown(8 * MIB))
    async with asyncio.timeout(60):
        while not (new := own_segments() - before):
            await asyncio.sleep(0)
        (name,) = new
        while os.stat(os.path.join(SHM, name)).st_blocks * 512 < 8 * MIB:  # pages reserved
            await asyncio.sleep(0)
    growing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await growing
    async with asyncio.timeout(60):  # removed at once in the copy, once its thread is done
        while os.path.exists(os.path.join(SHM, name)):
            await asyncio.sleep(0.01)
    assert body.to_bytes() == b"x" * 3 * MIB  # the old one is kept for its owner to release
    body.release()
