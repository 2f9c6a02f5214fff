"""A pool of spawned worker processes that outlives its workers (docs/design/door.md): the
body parser's and the video decoder's.

A worker can die between requests (the OOM killer, a crash); its `ProcessPoolExecutor` is
then broken for good and refuses every later task. Here the request that finds the pool
broken replaces it, once (requests that find it broken meanwhile wait for that replacement),
and is then served by the new pool. A request whose work was in the dying worker gets a
503 with Retry-After. A replacement that cannot start leaves the pool unusable, and the
gateway unready, until one does: the next request, or readiness probe, tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
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

    def start(self) -> None:
        """Start the processes now, without waiting for them (from the lifespan)."""
        if self._pool is None:
            self._pool = self._new_pool()
            self._pool.submit(self.warm_up)

    async def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)

    async def run(
        self, fn: Callable[..., Any], *args: Any, abandoned: Callable[[Future], None] | None = None
    ) -> Any:
        """`fn(*args)` in a worker. A request that goes away leaves its task running;
        `abandoned`, if given, is then called with its future once done."""
        future = await self.submit(fn, *args)
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            if abandoned is not None:
                future.add_done_callback(abandoned)
            raise
        except BrokenProcessPool:
            raise self.lost() from None

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
