"""The cache calls the gateway makes: a batched Reserve (docs/design.md §3 step 2), and Abandon
of the leases whose encode never ran."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import Enum

import grpc

from embedding_cache_svc.proto import cache_pb2, cache_pb2_grpc
from gateway.clients.channels import open_channel
from gateway.errors import APIError
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

    def __init__(self, address: str, fingerprint: bytes, timeout_s: float) -> None:
        self.address = address
        self.fingerprint = fingerprint
        self.timeout_s = timeout_s
        self._channel = open_channel(address)
        self._stub = cache_pb2_grpc.EmbeddingCacheStub(self._channel)

    async def reserve(
        self, items: Sequence[tuple[bytes, int]], lease_ms: int
    ) -> list[tuple[ReserveStatus, str]]:
        """Per (key, token_count): PRESENT, PENDING, RESERVED (ours to encode) or FAILED
        (with the reason the image could not be encoded)."""
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
            raise APIError(
                503, f"embedding cache unavailable: {err.details()}", code="cache_unavailable"
            ) from None
        states = []
        for state in reply.states:
            status = _FROM_WIRE.get(state.status)
            if status is None:
                raise APIError(502, f"embedding cache answered Reserve with status {state.status}")
            states.append((status, state.reason))
        if len(states) != len(items):
            raise APIError(502, f"cache answered {len(states)} states for {len(items)} items")
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
