"""The operator scales only what it owns: a Deployment an IrisAutoscaler names must carry
the release's label (`OperatorSettings.owner_label`, "key=value"; the chart sets
app.kubernetes.io/instance=<release>). Otherwise whoever may edit an IrisAutoscaler could
scale any workload in the namespace through it."""

from __future__ import annotations

import asyncio
import json

import kopf
import kubernetes

_RETRY_S = 10.0


class NotOwned(kopf.TemporaryError):
    """A target Deployment lacks the owner label (retried: the label may be added)."""


def parse_owner_label(text: str) -> tuple[str, str]:
    """("key", "value") of "key=value"; ValueError naming the text otherwise."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise ValueError(f"owner label must be key=value, got {text!r}")
    return key.strip(), value.strip()


async def check_owned(
    api: kubernetes.client.AppsV1Api, namespace: str, names: list[str], owner_label: str
) -> None:
    """Raise NotOwned naming the first Deployment of `names` that lacks the owner label."""
    key, value = parse_owner_label(owner_label)
    for name in names:
        try:
            # Only the labels are needed: the raw JSON, not the whole typed Deployment.
            raw = await asyncio.to_thread(
                api.read_namespaced_deployment, name, namespace, _preload_content=False
            )
        except kubernetes.client.ApiException as err:
            if err.status == 404:
                return  # reported as DeploymentNotFound by the scale read that follows
            raise kopf.TemporaryError(
                f"reading Deployment {namespace}/{name}: HTTP {err.status} {err.reason}",
                delay=_RETRY_S,
            ) from None
        try:
            labels = json.loads(raw.data).get("metadata", {}).get("labels") or {}
        except (ValueError, AttributeError):
            raise kopf.TemporaryError(
                f"reading Deployment {namespace}/{name}: not a Deployment", delay=_RETRY_S
            ) from None
        if labels.get(key) != value:
            found = labels.get(key)
            raise NotOwned(
                f"Deployment {namespace}/{name} is not this release's: its label {key} is "
                f"{found!r}, not {value!r}; the operator scales only Deployments labelled "
                f"{key}={value}",
                delay=_RETRY_S,
            )
