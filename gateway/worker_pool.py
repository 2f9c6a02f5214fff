"""A pool of spawned worker processes that outlives its workers (docs/design/door.md): the
body parser's and the video decoder's.

A worker can die between requests (the OOM killer, a crash); its `ProcessPoolExecutor` is
then broken for good and refuses every later task. Here the request that finds the pool
broken replaces it, once (requests that find it broken meanwhile wait for that replacement),
and is then served by the new pool. When a worker dies, every task the pool held fails with
it: each finds out whether it was the one running in that worker (a marker file it creates
in the worker when it starts and removes when it ends is still there) and only that one
gets a 503 with Retry-After; the others were waiting and are submitted again, once, to the
replacement (a second death is a 503 for them too, so no task is retried forever). A
replacement that cannot start leaves the pool unusable, and the gateway unready, until one
does: the next request, or readiness probe, tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from gateway.errors import APIError

log = logging.getLogger(__name__)


class WorkerPool:
    """`workers` spawned processes (a spawn, not a fork: nothing of the gateway's threads or
    sockets is inherited), named `name` in logs and errors. `warm_up`, a no-op importable
    from the workers' module, is every pool's first task: it has the processes start."""

    def __init__(
        self, name: str, workers: int, retry_after_s: int, warm_up: Callable[[], Any]
    ) -> None:
        self.name = name
        self.workers = workers
        self.retry_after_s = retry_after_s
        self.warm_up = warm_up
        self.usable = True  # False while no replacement could start
        self.starts = 0  # pools started, the first included
        self._pool: ProcessPoolExecutor | None = None
        self._replacing = asyncio.Lock()
        self._marker_dir: str | None = None

    def start(self) -> None:
        """Start the processes now, without waiting for them (from the lifespan)."""
        if self._pool is None:
            self._pool = self._new_pool()
            self._pool.submit(self.warm_up)

    async def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
        markers, self._marker_dir = self._marker_dir, None
        if markers is not None:
            shutil.rmtree(markers, ignore_errors=True)

    def _markers(self) -> str:
        """The folder of this pool's markers (made at the first task)."""
        if self._marker_dir is None:
            self._marker_dir = tempfile.mkdtemp(prefix="iris-pool-")
        return self._marker_dir

    async def run(
        self, fn: Callable[..., Any], *args: Any, abandoned: Callable[[Future], None] | None = None
    ) -> Any:
        """`fn(*args)` in a worker. A request that goes away leaves its task running;
        `abandoned`, if given, is then called with its future once done."""
        for attempt in range(2):
            marker = os.path.join(self._markers(), uuid.uuid4().hex)
            future = await self.submit(_tracked, marker, fn, *args)
            try:
                return await asyncio.shield(asyncio.wrap_future(future))
            except asyncio.CancelledError:
                future.add_done_callback(lambda _, marker=marker: _discard(marker))
                if abandoned is not None:
                    future.add_done_callback(abandoned)
                raise
            except BrokenProcessPool:
                if _discard(marker) or attempt:  # it ran in the dead worker, or died twice
                    raise self.lost() from None
                log.info("a task queued in a broken %s pool is submitted again", self.name)
        raise AssertionError("unreachable")

    async def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """`fn(*args)` submitted to the pool, replaced first if it is found broken."""
        pool = self._pool
        if pool is not None:
            try:
                return pool.submit(fn, *args)
            except BrokenProcessPool:
                pass
        pool = await self._replace(pool)
        try:
            return pool.submit(fn, *args)
        except BrokenProcessPool:  # the new pool's workers died already
            raise self.lost() from None

    async def recover(self) -> bool:
        """Whether the pool is usable, after one more try at replacing it if it was not."""
        if not self.usable:
            with contextlib.suppress(APIError):  # still not: the probe says so
                await self._replace(self._pool)
        return self.usable

    def lost(self) -> APIError:
        """The answer to a request whose work died with its worker."""
        return APIError(
            503,
            f"the {self.name} process stopped; send the request again",
            code="overloaded",
            retry_after=self.retry_after_s,
        )

    async def _replace(self, seen: ProcessPoolExecutor | None) -> ProcessPoolExecutor:
        """A working pool in place of `seen`: started here unless another request did it
        while this one waited."""
        async with self._replacing:
            if self._pool is seen:
                await self._start_again(seen)
            if self._pool is None:
                raise APIError(
                    503,
                    f"the {self.name} processes could not be started; send the request again",
                    code="overloaded",
                    retry_after=self.retry_after_s,
                )
            return self._pool

    async def _start_again(self, old: ProcessPoolExecutor | None) -> None:
        self._pool = None
        if old is not None:
            log.warning("a %s process died; starting the pool again", self.name)
            old.shutdown(wait=False, cancel_futures=True)
        pool = None
        try:
            pool = self._new_pool()
            started = asyncio.wrap_future(pool.submit(self.warm_up))
            try:
                await asyncio.shield(started)
            except asyncio.CancelledError:
                # This request went away: the pool stays for the next ones, which find it
                # broken if its start fails after all.
                self._pool = pool
                raise
        except (BrokenProcessPool, OSError) as err:
            log.error("the %s processes could not be started: %s", self.name, err)
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            self.usable = False
            return
        self._pool, self.usable = pool, True

    def _new_pool(self) -> ProcessPoolExecutor:
        self.starts += 1
        context = multiprocessing.get_context("spawn")
        return ProcessPoolExecutor(self.workers, mp_context=context)


def _tracked(marker: str, fn: Callable[..., Any], *args: Any) -> Any:
    """In a worker: `fn(*args)`, `marker` there while it runs. A marker left when the pool
    breaks names the task that was in the worker that died."""
    with open(marker, "x"):
        pass
    try:
        return fn(*args)
    finally:
        os.remove(marker)


def _discard(marker: str) -> bool:
    """Remove `marker`; whether it was there."""
    try:
        os.remove(marker)
    except FileNotFoundError:
        return False
    return True
