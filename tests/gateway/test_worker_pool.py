"""A worker pool that outlives its workers (gateway/worker_pool.py), on real spawned
processes: a worker killed while idle is replaced by the next task, once however many tasks
find it broken; a task whose worker dies under it is a 503 with Retry-After; a replacement
that cannot start leaves the pool, and /readyz, down until one does."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from pathlib import Path

import pytest

from gateway.errors import APIError
from gateway.worker_pool import WorkerPool
from tests.gateway.helpers import eventually, make_client, wait_ready


def warm_up_unless(flag: str) -> bool:
    """A warm-up that kills its worker while `flag` exists (a pool that cannot start)."""
    if os.path.exists(flag):
        os._exit(1)
    return True


def kill_and_wait(pid: int) -> None:
    """SIGKILL a worker and wait until the pool has reaped it (so it knows it is broken)."""
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: not Path(f"/proc/{pid}").exists())


@pytest.fixture
async def pool(tmp_path):
    flag = str(tmp_path / "no-start")
    running = WorkerPool("test worker", 1, 7, functools.partial(warm_up_unless, flag))
    running.start()
    running.flag = flag
    yield running
    await running.stop()


async def test_a_worker_killed_while_idle_is_replaced_by_the_next_task(pool):
    first = await pool.run(os.getpid)
    await asyncio.to_thread(kill_and_wait, first)
    second = await pool.run(os.getpid)
    assert second != first and pool.starts == 2 and pool.usable


async def test_tasks_that_find_the_pool_broken_together_share_one_replacement(pool):
    await asyncio.to_thread(kill_and_wait, await pool.run(os.getpid))
    pids = await asyncio.gather(*(pool.run(os.getpid) for _ in range(6)))
    assert len(set(pids)) == 1 and pool.starts == 2


async def test_a_task_whose_worker_dies_is_a_503_with_retry_after(pool):
    with pytest.raises(APIError) as lost:
        await pool.run(os._exit, 1)
    assert lost.value.status == 503 and lost.value.retry_after == 7
    assert "test worker process stopped" in lost.value.message
    assert await pool.run(os.getpid) > 0  # the next task is served by a new pool


def exit_when(flag: str) -> None:
    """Kill the worker once `flag` exists (so that the test can queue work behind it)."""
    while not os.path.exists(flag):
        time.sleep(0.01)
    os._exit(1)


async def test_only_the_task_in_the_dead_worker_gets_a_503(pool, tmp_path):
    """A task queued behind the one whose worker dies is served by the replacement."""
    flag = tmp_path / "die"
    dying = asyncio.ensure_future(pool.run(exit_when, str(flag)))
    queued = asyncio.ensure_future(pool.run(os.getpid))
    await asyncio.sleep(0)  # both are submitted: the second waits behind the first
    flag.touch()
    with pytest.raises(APIError) as lost:
        await dying
    assert lost.value.status == 503
    assert await queued > 0 and pool.starts == 2


async def test_a_replacement_that_cannot_start_leaves_the_pool_down_until_one_does(pool):
    await asyncio.to_thread(kill_and_wait, await pool.run(os.getpid))
    Path(pool.flag).touch()
    with pytest.raises(APIError) as down:
        await pool.run(os.getpid)
    assert down.value.status == 503 and "could not be started" in down.value.message
    assert not pool.usable and not await pool.recover()
    os.remove(pool.flag)
    assert await pool.recover() and await pool.run(os.getpid) > 0


def test_readyz_fails_while_a_pool_cannot_start(qwen_gateway_parts, tmp_path):
    flag = tmp_path / "no-start"
    flag.touch()
    with make_client(qwen_gateway_parts) as client:
        wait_ready(client)
        gateway = client.app.state.gateway
        gateway.bodies.pool = WorkerPool(
            "request body parser", 1, 1, functools.partial(warm_up_unless, str(flag))
        )
        with pytest.raises(APIError):
            client.portal.call(gateway.bodies.pool.run, os.getpid)
        response = client.get("/readyz")
        assert response.status_code == 503, response.text
        assert "request body parser processes could not start" in response.text
        flag.unlink()
        assert client.get("/readyz").status_code == 200
        client.portal.call(gateway.bodies.pool.stop)


async def test_a_replacement_outlives_the_request_that_started_it(pool):
    await asyncio.to_thread(kill_and_wait, await pool.run(os.getpid))
    finder = asyncio.create_task(pool.run(os.getpid))
    async with asyncio.timeout(60):
        while pool.starts < 2:  # the finder has begun the replacement
            await asyncio.sleep(0.01)
    finder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await finder
    assert await pool.run(os.getpid) > 0 and pool.starts == 2 and pool.usable
