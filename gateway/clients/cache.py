"""The cache calls the gateway makes: a batched Reserve (docs/design/gateway.md), and Abandon
of the leases whose encode never ran."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import Enum

import grpc

from embedding_cache_svc.proto import cache_pb2, cache_pb2_grpc
from gateway.clients.channels import open_channel
from gateway.errors import upstream_failure
from iris.mtls import TLSFiles
from iris.telemetry import grpc_metadata

log = logging.getLogger(__name__)


class ReserveStatus(Enum):
    PRESENT = "present"
    PENDING = "pending"
    RESERVED = "reserved"
    FAILED = "failed"


_FROM_WIRE = {
    cache_pb2.PRESENT: ReserveStatus.PRESENT,
    cache_pb2.PENDING: ReserveStatus.PENDING,
    cache_pb2.RESERVED: ReserveStatus.RESERVED,
    cache_pb2.FAILED: ReserveStatus.FAILED,
}


class CacheClient:
    """Reserve items in the embedding cache service; unavailability is a 503."""

    def __init__(
        self, address: str, fingerprint: bytes, timeout_s: float, tls: TLSFiles | None = None
    ) -> None:
        self.address = address
        self.fingerprint = fingerprint
        self.timeout_s = timeout_s
        self._channel = open_channel(address, tls, "cache")
        self._stub = cache_pb2_grpc.EmbeddingCacheStub(self._channel)

    async def reserve(
        self, items: Sequence[tuple[bytes, int]], lease_ms: int, request_id: str | None = None
    ) -> list[tuple[ReserveStatus, str]]:
        """Per (key, token_count): PRESENT, PENDING, RESERVED (ours to encode) or FAILED
        (with the reason the image could not be encoded). A fault is a 503 / 502 whose body
        names neither the cache nor its store (they go to the log under `request_id`)."""
        request = cache_pb2.ReserveRequest(
            fingerprint=self.fingerprint,
            items=[cache_pb2.ItemRequest(key=key, token_count=count) for key, count in items],
            lease_ms=lease_ms,
        )
        try:
            reply = await self._stub.Reserve(
                request, timeout=self.timeout_s, metadata=grpc_metadata()
            )
        except grpc.aio.AioRpcError as err:
            raise upstream_failure(
                503,
                "the embedding cache is unavailable",
                code="cache_unavailable",
                request_id=request_id,
                detail=f"cache {self.address}: {err.code().name} {err.details()}",
            ) from None
        states = []
        for state in reply.states:
            status = _FROM_WIRE.get(state.status)
            if status is None:
                raise upstream_failure(
                    502,
                    "the embedding cache gave an invalid answer",
                    code="upstream_error",
                    request_id=request_id,
                    detail=f"Reserve answered with status {state.status}",
                )
            states.append((status, state.reason))
        if len(states) != len(items):
            raise upstream_failure(
                502,
                "the embedding cache gave an invalid answer",
                code="upstream_error",
                request_id=request_id,
                detail=f"Reserve answered {len(states)} states for {len(items)} items",
            )
        return states

    async def abandon(self, keys: Sequence[bytes]) -> None:
        """End our leases on `keys` (their encode failed: no entry will come from us), so the
        next request for those images reserves and encodes them at once instead of waiting
        out the lease. Best effort: if the cache cannot be reached, the leases expire."""
        request = cache_pb2.KeysRequest(fingerprint=self.fingerprint, keys=list(keys))
        try:
            await self._stub.Abandon(request, timeout=self.timeout_s, metadata=grpc_metadata())
        except grpc.aio.AioRpcError as err:
            log.warning("could not abandon %d leases: %s", len(keys), err.details())

    async def close(self) -> None:
        await self._channel.close()
