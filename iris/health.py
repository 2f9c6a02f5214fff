"""A service's gRPC health (grpc.health.v1), set the one way every Iris service sets it:
the overall status (service "") and the service's own name always move together."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


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
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", self.service_name):
            await self.servicer.set(name, status)
