"""Readiness over gRPC health, kept true by a periodic check (the contract every service
follows: grpc.health.v1 answers readiness, HTTP /healthz answers liveness).

A service gives `Readiness` a `check()` that returns None while it can do its work and a
short reason while it cannot (its engine thread died, a step has run too long while work
waits, its store is unreachable). Every `interval_s` the check runs and the status of the
service's names ("" and its own) follows it, so a watcher (the gateway, a kubelet's `grpc`
probe) sees NOT_SERVING as soon as the check fails. `stop()` turns it NOT_SERVING for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from grpc_health.v1 import health, health_pb2

log = logging.getLogger(__name__)
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Readiness:
    """gRPC health of `names` on `servicer`, following `check()` every `interval_s`."""

    def __init__(
        self,
        servicer: health.aio.HealthServicer,
        names: Sequence[str],
        check: Callable[[], str | None],
        interval_s: float,
    ) -> None:
        self.servicer = servicer
        self.names = tuple(names)
        self.check = check
        self.interval_s = interval_s
        self.reason: str | None = "not started"
        self._stopped = False
        self._task: asyncio.Task | None = None

    @property
    def serving(self) -> bool:
        return self.reason is None

    async def start(self) -> None:
        """Apply the check now, then keep applying it in the background."""
        self._stopped = False
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="readiness")

    async def refresh(self) -> None:
        """Run the check once and publish its outcome."""
        try:
            reason = "stopping" if self._stopped else self.check()
        except Exception as err:  # a broken check means the service cannot vouch for itself
            reason = f"health check failed: {type(err).__name__}: {err}"
        if reason != self.reason:
            if reason is None:
                log.info("ready again (was: %s)", self.reason)
            else:
                log.warning("not ready: %s", reason)
        self.reason = reason
        status = _SERVING if reason is None else _NOT_SERVING
        for name in self.names:
            await self.servicer.set(name, status)

    async def stop(self) -> None:
        """NOT_SERVING from now on (shutdown begins)."""
        self._stopped = True
        await self.refresh()  # first: a watcher must learn it before anything else stops
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.refresh()
