"""The in-memory index of pods by label, and selection by matchLabels.

kopf keeps the index current from a pod watch; each pod appears once under every
(namespace, label key, label value) it carries, so a selector is an intersection of sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf


@dataclass(frozen=True)
class PodRef:
    """What the operator needs of a pod: where to scrape it and whether it serves."""

    name: str
    ip: str
    ready: bool


def index_pod(
    *,
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    status: Mapping[str, Any],
    meta: Mapping[str, Any],
    **_: Any,
) -> dict[tuple[str, str, str], PodRef]:
    """kopf index function: a pod with an IP under each of its labels; terminating pods out."""
    ip = status.get("podIP")
    if not ip or meta.get("deletionTimestamp"):
        return {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    ref = PodRef(name=name, ip=ip, ready=ready)
    return {(namespace, key, value): ref for key, value in labels.items()}


def select_pods(
    index: kopf.Index | Mapping, namespace: str, match_labels: Mapping[str, str]
) -> list[PodRef]:
    """The pods of `namespace` carrying every label of `match_labels`, sorted by name."""
    chosen: set[PodRef] | None = None
    for key, value in match_labels.items():
        found = index.get((namespace, key, value))
        pods = set(found) if found is not None else set()
        chosen = pods if chosen is None else chosen & pods
    return sorted(chosen or (), key=lambda pod: pod.name)
