"""gRPC health (grpc.health.v1) the one way every Iris service sets it: readiness over
gRPC health, liveness over HTTP /healthz.

`ServiceHealth` holds a service's health servicer; the overall status (service "") and the
service's own name always move together. `Readiness` keeps it true: a service gives it a
`check()` that returns None while it can do its work and a short reason while it cannot
(its engine thread died, a step has run too long while work waits, its store is
unreachable). Every `interval_s` the check runs and the status follows it, so a watcher
(the gateway, a kubelet's `grpc` probe) sees NOT_SERVING as soon as the check fails.
`stop()` turns it NOT_SERVING for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ServiceHealth:
    """The health servicer of one gRPC service and its current state (`serving`)."""

    def __init__(self, service_name: str) -> None:
        self.service_name = service_name
        self.servicer = health.aio.HealthServicer()
        self.serving = False

    def add_to(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def set(self, serving: bool) -> None:
        """SERVING or NOT_SERVING, for "" and the service's name."""
        self.serving = serving
        for name in ("", self.service_name):
            await self.servicer.set(name, _SERVING if serving else _NOT_SERVING)


class Readiness:
    """`health` following `check()` every `interval_s`."""

    def __init__(
        self, health: ServiceHealth, check: Callable[[], str | None], interval_s: float
    ) -> None:
        self.health = health
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
        await self.health.set(reason is None)

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
