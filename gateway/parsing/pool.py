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

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from gateway import metrics
from gateway.parsing.shared_body import SharedBody
from gateway.parsing.transport import remove_shared, unpack, unpack_shared
from gateway.parsing.worker import parse_body, parse_shared, ready
from gateway.worker_pool import WorkerPool


class BodyParser:
    """`workers` processes (0: none, every body is parsed on the loop); `start` and `stop`
    from the gateway's lifespan. A worker that dies is replaced (gateway/worker_pool.py)."""

    def __init__(self, workers: int, in_process_max_bytes: int, retry_after_s: int = 1) -> None:
        self.workers = workers
        self.in_process_max_bytes = in_process_max_bytes
        self.pool = WorkerPool("request body parser", max(1, workers), retry_after_s, ready)

    def takes(self, body: bytes | SharedBody) -> bool:
        """Whether `body` is parsed in a worker process (else on the loop)."""
        if isinstance(body, SharedBody):
            return True
        return self.workers > 0 and len(body) > self.in_process_max_bytes

    def start(self) -> None:
        """Spawn the processes now, so that the first large body does not wait for them."""
        if self.workers > 0:
            self.pool.start()

    async def stop(self) -> None:
        await self.pool.stop()

    async def parse(self, model: type[BaseModel], body: bytes | SharedBody) -> BaseModel:
        """`body` as a validated `model`, parsed in a worker process; raises what FastAPI's
        own parse would (RequestValidationError, or a 400 HTTPException), or a 503 when the
        worker died with it. A SharedBody must stay until this returns."""
        metrics.BODY_PARSES.labels("process").inc()
        # A request that goes away leaves its outcome, when the worker is done, removed unread.
        if isinstance(body, SharedBody):
            task = (parse_shared, model, body.name, body.size)
        else:
            task = (parse_body, model, body)
        packed = await self.pool.run(*task, abandoned=_remove_unread)
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
