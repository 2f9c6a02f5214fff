"""Where the peers come from: the settings' static lists, or Kubernetes EndpointSlices."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def ready_addresses(slices: Sequence[dict], port_name: str | None = None) -> list[str]:
    """`host:port` of every ready endpoint in EndpointSlice objects (dicts, API field names).

    The port is the one named `port_name`, else the slice's first port.
    """
    addresses = set()
    for item in slices:
        ports = item.get("ports") or []
        chosen = next((p for p in ports if port_name and p.get("name") == port_name), None)
        chosen = chosen or (ports[0] if ports else None)
        if not chosen or chosen.get("port") is None:
            continue
        for endpoint in item.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            if conditions.get("ready") is False or conditions.get("terminating") is True:
                continue
            for host in endpoint.get("addresses") or []:
                host = f"[{host}]" if ":" in host else host
                addresses.add(f"{host}:{chosen['port']}")
    return sorted(addresses)


@dataclass(eq=False)
class EndpointSliceDiscovery:
    """Polls a Service's EndpointSlices and reports the ready addresses when they change.

    `api`: a kubernetes DiscoveryV1Api; by default one from the in-cluster config, else the
    kubeconfig."""

    namespace: str
    service: str
    on_change: Callable[[list[str]], Awaitable[None]]
    _: KW_ONLY
    interval_s: float
    port_name: str = "grpc"
    api: Any = None
    _last: list[str] | None = field(default=None, init=False, repr=False)

    def _list(self) -> list[dict]:
        if self.api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self.api = client.DiscoveryV1Api()
        result = self.api.list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"{SERVICE_NAME_LABEL}={self.service}"
        )
        slices = [self.api.api_client.sanitize_for_serialization(s) for s in result.items]
        # The API server applies the selector; checking it again here costs nothing and
        # keeps another Service's endpoints out if a server (or an emulator) ignores it.
        return [
            item
            for item in slices
            if ((item.get("metadata") or {}).get("labels") or {}).get(SERVICE_NAME_LABEL)
            == self.service
        ]

    async def run(self) -> None:
        while True:
            try:
                slices = await asyncio.to_thread(self._list)
                addresses = ready_addresses(slices, self.port_name)
                if addresses != self._last:
                    self._last = addresses
                    log.info("%s endpoints: %s", self.service, addresses)
                    await self.on_change(addresses)
            except Exception as err:  # the API server may be briefly away: keep the last list
                log.warning("listing EndpointSlices of %s failed: %s", self.service, err)
            await asyncio.sleep(self.interval_s)
