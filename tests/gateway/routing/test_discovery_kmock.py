"""EndpointSlice discovery against kmock's emulated Kubernetes API (no real API server can
run on these machines; kmock serves the same HTTP API from memory)."""

from __future__ import annotations

import asyncio

import kmock as kmocklib
import pytest

from gateway.routing.discovery import SERVICE_NAME_LABEL, EndpointSliceDiscovery

NS = "serving"
SLICES = "discovery.k8s.io/v1/endpointslices"


def _slice(name: str, service: str, endpoints: list[tuple[str, bool]]) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {SERVICE_NAME_LABEL: service}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": 50053, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [ip], "conditions": {"ready": ready}} for ip, ready in endpoints
        ],
    }


def _api(k8s: kmocklib.KubernetesEmulator):
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = str(k8s.url).rstrip("/")
    return client.DiscoveryV1Api(client.ApiClient(configuration))


async def test_ready_endpoints_of_the_service_are_reported_as_they_change(kmock):
    """Only the named Service's ready endpoints count (kmock ignores label selectors, so
    this also checks the client's own filter); adding or deleting a slice reports the new
    list, and an unchanged list is not reported again."""
    kmock.resources[SLICES] = {
        "kind": "EndpointSlice",
        "namespaced": True,
        "verbs": ["get", "list", "watch"],
    }
    kmock.objects[SLICES, NS, "llm-a"] = _slice("llm-a", "iris-llm", [("10.0.0.1", True)])
    kmock.objects[SLICES, NS, "other"] = _slice("other", "iris-encoder", [("10.0.9.9", True)])
    seen: list[list[str]] = []

    async def on_change(addresses: list[str]) -> None:
        seen.append(addresses)

    discovery = EndpointSliceDiscovery(NS, "iris-llm", on_change, interval_s=0.05, api=_api(kmock))
    task = asyncio.create_task(discovery.run())
    try:
        await _until(lambda: seen == [["10.0.0.1:50053"]])
        kmock.objects[SLICES, NS, "llm-b"] = _slice(
            "llm-b", "iris-llm", [("10.0.0.2", True), ("10.0.0.3", False)]
        )
        await _until(lambda: seen[-1] == ["10.0.0.1:50053", "10.0.0.2:50053"])
        del kmock.objects[SLICES, NS, "llm-a"]  # its pod went away
        await _until(lambda: seen[-1] == ["10.0.0.2:50053"])
        assert len(seen) == 3  # reported on change only
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def _until(check, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)
