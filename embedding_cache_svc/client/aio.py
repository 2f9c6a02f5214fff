"""The asyncio client (grpc.aio), for the gateway and the encoder."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from embedding_cache_svc.client.core import (
    Assembler,
    ClientBase,
    Request,
    parse_states,
    stats_dict,
)
from embedding_cache_svc.client.errors import Status, from_rpc_error
from embedding_cache_svc.entry import Failed
from embedding_cache_svc.proto import cache_pb2
from iris.mtls import aio_channel
from iris.telemetry import grpc_metadata


class AsyncCacheClient(ClientBase):
    """Asyncio client (see ClientBase)."""

    open_channel = aio_channel

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncCacheClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _call(self, op: str, method, request, timeout_s: float | None):
        try:
            return await method(
                request, timeout=timeout_s or self.core.timeout_s, metadata=grpc_metadata()
            )
        except grpc.RpcError as err:
            raise from_rpc_error(err, op) from None

    async def put(
        self, key: bytes, tensor, token_count: int, timeout_s: float | None = None
    ) -> int:
        """Store `tensor` ([token_count, hidden]) under `key`; ends any lease on it.
        Returns the bytes stored."""
        messages = self.core.put_messages(key, tensor, token_count)
        reply = await self._call("put", self._stub.Put, messages, timeout_s)
        return reply.bytes_stored

    async def get_many(
        self,
        requests: Sequence[Request],
        hidden: int,
        dtype,
        *,
        hold: bool = False,
        timeout_s: float | None = None,
    ) -> dict[bytes, object]:
        """key -> tensor (checksum verified), Failed(reason), or None (a miss) per
        (key, token_count). `hold=True` pins the returned tensors in the L1 until
        `release(keys)`."""
        plan = self.core.plan_get(requests, hidden, dtype, hold)
        if not plan.missing:
            return plan.results
        assembler = Assembler(plan)
        try:
            stream = self._stub.BatchGet(
                self.core.get_request(plan),
                timeout=timeout_s or self.core.timeout_s,
                metadata=grpc_metadata(),
            )
            async for message in stream:
                assembler.feed(message)
        except grpc.RpcError as err:
            raise from_rpc_error(err, "get") from None
        if assembler.corrupt:
            await self.delete(assembler.corrupt, timeout_s=timeout_s)
        return self.core.finish_get(plan, assembler)

    def release(self, keys: Sequence[bytes]) -> None:
        """Undo `hold=True` of an earlier get_many for these keys."""
        self.core.release(keys)

    async def exists(self, keys: Sequence[bytes], timeout_s: float | None = None) -> list[bool]:
        request = self.core.keys_request(keys)
        reply = await self._call("exists", self._stub.Exists, request, timeout_s)
        return list(reply.present)

    async def delete(self, keys: Sequence[bytes], timeout_s: float | None = None) -> int:
        request = self.core.keys_request(keys)
        reply = await self._call("delete", self._stub.Delete, request, timeout_s)
        return reply.deleted

    async def reserve(
        self, items: Sequence[Request], lease_ms: int, timeout_s: float | None = None
    ) -> list[Status | Failed]:
        """Per (key, token_count): PRESENT, PENDING, RESERVED (produce it, then put or
        fail), or Failed(reason)."""
        request = self.core.reserve_request(items, lease_ms)
        reply = await self._call("reserve", self._stub.Reserve, request, timeout_s)
        return parse_states(reply)

    async def fail(self, key: bytes, reason: str, timeout_s: float | None = None) -> None:
        """Record that `key` cannot be produced; ends its lease and releases waiters."""
        await self._call("fail", self._stub.Fail, self.core.fail_request(key, reason), timeout_s)

    async def wait(
        self, items: Sequence[Request], deadline_s: float, timeout_s: float | None = None
    ) -> dict[bytes, Status | Failed]:
        """Block until each item is PRESENT, Failed(reason) or FREE, or until deadline_s
        (items still leased then are PENDING). token_count 0 skips the count check."""
        request = self.core.wait_request(items, deadline_s)
        budget = deadline_s + (timeout_s or self.core.timeout_s)
        reply = await self._call("wait", self._stub.Wait, request, budget)
        return dict(zip([key for key, _ in items], parse_states(reply), strict=True))

    async def stats(self, timeout_s: float | None = None) -> dict:
        reply = await self._call("stats", self._stub.Stats, cache_pb2.StatsRequest(), timeout_s)
        return stats_dict(reply, self.core.l1)
