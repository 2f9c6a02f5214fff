"""What the encoder's and the LLM pod's servers share: their two listeners and readiness.

A `GrpcService` owns a role-checked gRPC server on `settings.host:settings.port` (mutual TLS
when the settings name certificates; port 0 picks a free port), gRPC health on it as
readiness, and /metrics + /healthz over plain HTTP on `settings.metrics_port`.

Both follow the service's `work_loop` (the encoder's batch loop, the pod's engine thread):
/healthz is liveness, 200 while the loop runs; readiness (iris/health.py) is SERVING while
the loop runs, reports no `fault` (an optional attribute of the loop) and has not held work
without progress for longer than `stall_limit_s`. A
subclass builds its own parts, sets `work_loop`, then calls `_listen()`; on `stop()` it drains
in its own order (`_drain`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import grpc
from prometheus_client import CollectorRegistry

from iris.health import Readiness, ServiceHealth
from iris.metrics_http import MetricsHTTPServer
from iris.mtls import role_interceptors
from iris.mtls.credentials import add_port


class WorkLoop(Protocol):
    """The loop that does a service's work, as liveness and readiness watch it."""

    name: str  # how the reasons name it: "the batch loop", "the engine thread"

    @property
    def alive(self) -> bool:
        """Started and not ended."""
        ...

    def stalled_for(self) -> float:
        """Seconds the loop has held work without finishing a unit of it (a batch, a step);
        0 while it has none."""
        ...


class GrpcService:
    """Base of one gRPC service's server: `address`, `port` and `metrics_port` once started,
    `readiness.reason` (None while ready), `wait()` until the gRPC server ends."""

    def __init__(self, service_name: str, settings: Any, stall_limit_s: float) -> None:
        self.settings = settings
        self.stall_limit_s = stall_limit_s
        self.work_loop: WorkLoop | None = None  # set by the subclass's start()
        self.health = ServiceHealth(service_name)
        self.readiness = Readiness(self.health, self._not_ready_because, settings.health_interval_s)
        self.port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._http: MetricsHTTPServer | None = None

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

    def _alive(self) -> bool:
        return self.work_loop is not None and self.work_loop.alive

    def _not_ready_because(self) -> str | None:
        """Why this service cannot take work now (None: it can)."""
        loop = self.work_loop
        if loop is None:
            return "not started"
        if not loop.alive:
            return f"{loop.name} has ended"
        # A loop may say it is unfit for work while it still runs (the pod's engine thread
        # after a failed step, while it probes).
        fault = getattr(loop, "fault", None)
        if fault:
            return fault
        stalled = loop.stalled_for()
        if stalled > self.stall_limit_s:
            return (
                f"{loop.name} has made no progress for {stalled:.0f} s while work waits "
                f"(limit {self.stall_limit_s:g} s)"
            )
        return None

    def _health_body(self) -> dict:
        """/healthz's body: liveness in "ok" (200 or 503), readiness and its reason beside."""
        return {
            "ok": self._alive(),
            "serving": self.readiness.serving,
            "reason": self.readiness.reason,
        }

    async def _listen(
        self,
        add_servicer: Callable[[Any, grpc.aio.Server], None],
        servicer: Any,
        options: list[tuple[str, Any]],
        registry: CollectorRegistry,
        max_concurrent_rpcs: int | None = None,
    ) -> None:
        """Serve `servicer` (added by its generated `add_*Servicer_to_server`) and health on a
        gRPC server with `options` (beyond `max_concurrent_rpcs` calls at once, gRPC answers
        RESOURCE_EXHAUSTED), start the HTTP server, then start publishing readiness."""
        settings = self.settings
        tls = settings.tls()
        self._server = grpc.aio.server(
            # A port already taken must fail the start, not be shared with its owner.
            options=[*options, ("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=max_concurrent_rpcs,
            interceptors=role_interceptors(tls),
        )
        add_servicer(servicer, self._server)
        self.health.add_to(self._server)
        self.port = add_port(self._server, f"{settings.host}:{settings.port}", tls)
        await self._server.start()
        self._http = MetricsHTTPServer(
            registry, self._health_body, settings.host, settings.metrics_port
        )
        self._http.start()
        self.metrics_port = self._http.port
        await self.readiness.start()

    async def stop(self, grace_s: float | None = None) -> None:
        """NOT_SERVING at once, then the subclass's `_drain` for `grace_s` (default the
        settings' `shutdown_grace_s`), then the HTTP server (liveness answers until then)."""
        await self.readiness.stop()
        await self._drain(self.settings.shutdown_grace_s if grace_s is None else grace_s)
        if self._http is not None:
            self._http.stop()

    async def _drain(self, grace_s: float) -> None:
        """Finish or end the service's work within `grace_s` and close its gRPC server."""
        raise NotImplementedError

    async def wait(self) -> None:
        assert self._server is not None, "start() first"
        await self._server.wait_for_termination()
