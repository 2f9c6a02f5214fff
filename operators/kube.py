"""The Deployments' scale subresource through the kubernetes client.

The client is synchronous, so each call runs in a worker thread to keep kopf's event loop
free. API failures become `kopf.TemporaryError` (kopf retries the reconcile later).
"""

from __future__ import annotations

import asyncio

import kopf
import kubernetes

_RETRY_S = 10.0


def make_apps_api(api_server: str | None) -> kubernetes.client.AppsV1Api:
    """An AppsV1Api for `api_server` (no credentials), else in-cluster, else kubeconfig."""
    if api_server:
        config = kubernetes.client.Configuration(host=api_server.rstrip("/"))
        return kubernetes.client.AppsV1Api(kubernetes.client.ApiClient(config))
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.AppsV1Api()


class DeploymentMissing(kopf.TemporaryError):
    """The Deployment an autoscaler names does not exist (yet)."""


async def read_replicas(api: kubernetes.client.AppsV1Api, namespace: str, name: str) -> int:
    """The Deployment's spec.replicas, read through its scale subresource."""
    try:
        scale = await asyncio.to_thread(api.read_namespaced_deployment_scale, name, namespace)
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            raise DeploymentMissing(
                f"Deployment {namespace}/{name} not found", delay=_RETRY_S
            ) from None
        raise kopf.TemporaryError(
            f"reading scale of {namespace}/{name}: HTTP {err.status} {err.reason}", delay=_RETRY_S
        ) from None
    return int(scale.spec.replicas or 0)


async def write_replicas(
    api: kubernetes.client.AppsV1Api, namespace: str, name: str, replicas: int
) -> None:
    """Set the Deployment's spec.replicas through its scale subresource."""
    body = {"spec": {"replicas": replicas}}
    try:
        await asyncio.to_thread(api.patch_namespaced_deployment_scale, name, namespace, body)
    except kubernetes.client.ApiException as err:
        raise kopf.TemporaryError(
            f"scaling {namespace}/{name} to {replicas}: HTTP {err.status} {err.reason}",
            delay=_RETRY_S,
        ) from None
