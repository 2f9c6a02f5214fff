"""Liveness (/healthz) and readiness (/readyz: a usable LLM pod, and worker processes that
could be started). /metrics is served on the
metrics port (gateway/serving.py), never on the client-facing one."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.api.deps import GatewayDep
from gateway.errors import APIError

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict:
    """The process serves HTTP."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "no usable LLM pod, or a worker pool down"}})
async def readyz(gateway: GatewayDep) -> dict:
    """At least one LLM pod has passed its handshake, answers load polls and reports
    SERVING on its gRPC health; and no worker pool is down (one whose replacement could
    not start is tried again here, so that a replica out of rotation can come back)."""
    pods = gateway.pods()
    if not gateway.ready():
        raise APIError(503, f"no usable LLM pod among {len(pods)}", code="not_ready")
    for pool in gateway.worker_pools():
        if not await pool.recover():
            raise APIError(503, f"the {pool.name} processes could not start", code="not_ready")
    return {"status": "ready", "pods": sum(pod.usable for pod in pods)}
