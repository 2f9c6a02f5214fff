"""The set of LLM pods: a channel, a stub and a watcher task per address."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field

import grpc
from grpc_health.v1 import health_pb2_grpc

from gateway import metrics
from gateway.clients.channels import open_channel
from gateway.routing.kv_index import KVIndex
from gateway.routing.pods import Pod
from gateway.routing.watcher import PodWatcher
from iris.mtls import TLSFiles
from llm_svc.proto import llm_pb2_grpc

log = logging.getLogger(__name__)


@dataclass
class PodConnection:
    pod: Pod
    channel: grpc.aio.Channel
    stub: llm_pb2_grpc.LLMStub
    watcher: PodWatcher
    task: asyncio.Task


@dataclass(eq=False)
class PodRegistry:
    """Adds and removes pods as discovery reports addresses; routing reads `pods()`."""

    index: KVIndex
    fingerprint: bytes
    _: KW_ONLY
    poll_interval_s: float
    timeout_s: float
    tls: TLSFiles | None = None
    _connections: dict[str, PodConnection] = field(default_factory=dict, init=False, repr=False)
    _added: int = field(default=0, init=False, repr=False)

    def pods(self) -> list[Pod]:
        return [connection.pod for connection in self._connections.values()]

    def connection(self, address: str) -> PodConnection:
        return self._connections[address]

    async def set_addresses(self, addresses: Sequence[str]) -> None:
        """Start watching new pods; stop and forget those no longer listed."""
        wanted = set(addresses)
        for address in set(self._connections) - wanted:
            await self._remove(address)
        for address in sorted(wanted - set(self._connections)):
            # `pod-N` until the pod's handshake tells its own name (metrics never show an
            # address: docs/design/door.md).
            pod = Pod(address, name=f"pod-{self._added}")
            self._added += 1
            channel = open_channel(address, self.tls, "llm")
            stub = llm_pb2_grpc.LLMStub(channel)
            watcher = PodWatcher(
                pod,
                stub,
                self.index,
                self.fingerprint,
                poll_interval_s=self.poll_interval_s,
                timeout_s=self.timeout_s,
                health=health_pb2_grpc.HealthStub(channel),
            )
            task = asyncio.create_task(watcher.run(), name=f"watch {address}")
            self._connections[address] = PodConnection(pod, channel, stub, watcher, task)
            log.info("watching LLM pod %s", address)

    async def _remove(self, address: str) -> None:
        connection = self._connections.pop(address)
        connection.task.cancel()
        await asyncio.gather(connection.task, return_exceptions=True)
        await connection.channel.close()
        self.index.forget(address)
        metrics.forget_pod(connection.pod.name)
        log.info("LLM pod %s left", address)

    async def close(self) -> None:
        for address in list(self._connections):
            await self._remove(address)
