"""The gateway's body parser: bodies over `in_process_max_bytes` are parsed and validated
in a pool of worker processes, the rest on the event loop as FastAPI does.

`json.loads` and pydantic's validation are C code that holds the GIL for the whole body, so
a worker thread would not free the loop; a process does. A large body reaches the worker in
shared memory (written chunk by chunk as it arrived: gateway/parsing/shared_body.py), and a
large outcome comes back in a segment the worker leaves, unpickled on a worker thread frame
by frame, each a bounded copy and C call (gateway/parsing/transport.py). Only names and
sizes cross the pool's pipe. docs/design/door.md.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from gateway import metrics
from gateway.errors import APIError
from gateway.parsing.shared_body import SharedBody
from gateway.parsing.transport import remove_shared, unpack, unpack_shared
from gateway.parsing.worker import parse_body, parse_shared, ready

log = logging.getLogger(__name__)


class BodyParser:
    """`workers` processes (0: none, every body is parsed on the loop); `start` and `stop`
    from the gateway's lifespan."""

    def __init__(self, workers: int, in_process_max_bytes: int, retry_after_s: int = 1) -> None:
        self.workers = workers
        self.in_process_max_bytes = in_process_max_bytes
        self.retry_after_s = retry_after_s
        self._pool: ProcessPoolExecutor | None = None

    def takes(self, body: bytes | SharedBody) -> bool:
        """Whether `body` is parsed in a worker process (else on the loop)."""
        if isinstance(body, SharedBody):
            return True
        return self.workers > 0 and len(body) > self.in_process_max_bytes

    def start(self) -> None:
        """Spawn the processes now (a spawn, not a fork: nothing of the gateway's threads or
        sockets is inherited), so that the first large body does not wait for them."""
        if self.workers <= 0 or self._pool is not None:
            return
        context = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(self.workers, mp_context=context)
        self._pool.submit(ready)  # the pool starts every process on its first task

    async def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)

    async def parse(self, model: type[BaseModel], body: bytes | SharedBody) -> BaseModel:
        """`body` as a validated `model`, parsed in a worker process; raises what FastAPI's
        own parse would (RequestValidationError, or a 400 HTTPException). A SharedBody must
        stay until this returns."""
        if self._pool is None:
            self.start()
        assert self._pool is not None
        metrics.BODY_PARSES.labels("process").inc()
        if isinstance(body, SharedBody):
            future = self._pool.submit(parse_shared, model, body.name, body.size)
        else:
            future = self._pool.submit(parse_body, model, body)
        try:
            packed = await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            # The request is gone: its outcome, when the worker is done, is removed unread.
            future.add_done_callback(_remove_unread)
            raise
        except BrokenProcessPool:
            # A worker died (killed for its memory?): a fresh pool for the next request.
            log.warning("a body parser process died; starting the pool again")
            self._pool = None
            self.start()
            raise APIError(
                503,
                "the request body's parser stopped; send the request again",
                code="overloaded",
                retry_after=self.retry_after_s,
            ) from None
        if isinstance(packed, tuple):  # left in a segment of its own: read, then removed
            outcome = await asyncio.to_thread(unpack_shared, *packed)
        else:
            outcome = await asyncio.to_thread(unpack, packed)
        kind = outcome[0]
        if kind == "model":
            return outcome[1]
        if kind == "errors":
            raise RequestValidationError(outcome[1])
        raise HTTPException(outcome[1], outcome[2])


def _remove_unread(future) -> None:
    if not future.cancelled() and future.exception() is None:
        packed = future.result()
        if isinstance(packed, tuple):
            remove_shared(packed[0])
