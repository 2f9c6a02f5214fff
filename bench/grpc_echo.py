"""The physical floor under the cache benchmark: a grpc.aio server (the cache service's
server type) that answers from memory, with no Redis and no cache logic.

    .venv/bin/python bench/grpc_echo.py PORT CHUNK_BYTES

Methods (raw bytes, no protobuf): `/bench.Echo/Empty` answers b"" (the cost of a call);
`/bench.Echo/Unary` answers N bytes in one message and `/bench.Echo/Stream` the same N
bytes as messages of CHUNK_BYTES (as the service streams an entry), N being the request's
decimal text. bench/cache.py starts it and times it beside the service.
"""

from __future__ import annotations

import asyncio
import os
import sys

import grpc

METHODS = ("Empty", "Unary", "Stream")


def _same(data: bytes) -> bytes:
    return data


class Payloads:
    """Random bytes per requested size, made once (the floor is the transfer, not making them)."""

    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self._by_size: dict[int, bytes] = {}

    def get(self, request: bytes) -> bytes:
        size = int(request)
        if size not in self._by_size:
            self._by_size[size] = os.urandom(size)
        return self._by_size[size]

    async def empty(self, request: bytes, context) -> bytes:
        return b""

    async def unary(self, request: bytes, context) -> bytes:
        return self.get(request)

    async def stream(self, request: bytes, context):
        data = memoryview(self.get(request))
        for lo in range(0, len(data), self.chunk_bytes):
            yield bytes(data[lo : lo + self.chunk_bytes])


async def serve(port: int, chunk_bytes: int) -> None:
    payloads = Payloads(chunk_bytes)
    handlers = {
        "Empty": grpc.unary_unary_rpc_method_handler(payloads.empty, _same, _same),
        "Unary": grpc.unary_unary_rpc_method_handler(payloads.unary, _same, _same),
        "Stream": grpc.unary_stream_rpc_method_handler(payloads.stream, _same, _same),
    }
    limit = 64 << 20
    options = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), int(sys.argv[2])))
