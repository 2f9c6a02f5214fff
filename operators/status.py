"""The autoscaler's status: per-pool figures and the Ready / ScalingActive / ScalingLimited
conditions (a condition keeps its lastTransitionTime until its status flips)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from operators.policy import PoolDecision

_ERROR_CHARS = 300


@dataclass(frozen=True)
class Condition:
    """One condition as this round sees it."""

    type: str
    status: bool
    reason: str
    message: str


def pool_status(
    deployment: str,
    decision: PoolDecision,
    ready_pods: int,
    scraped: int,
    failed: int,
    last_scale_time: str | None,
    failures: Mapping[str, str] | None = None,
    write_error: str | None = None,
) -> dict[str, Any]:
    """The status block of one pool; `failures` (pod -> why its scrape failed) shows as
    `scrapeError`, the first pod's reason, bounded; `write_error` is why this round's scale
    write failed."""
    block: dict[str, Any] = {
        "deployment": deployment,
        "currentReplicas": decision.current,
        "desiredReplicas": decision.desired,
        "readyPods": ready_pods,
        "scrapedPods": scraped,
        "failedScrapes": failed,
        "reason": f"{decision.reason}: {decision.message}",
        "summary": f"{decision.current}/{decision.desired}",
    }
    if last_scale_time:
        block["lastScaleTime"] = last_scale_time
    if failures:
        pod = min(failures)
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        block["scrapeError"] = f"{pod}: {failures[pod]}"[:_ERROR_CHARS] + more
    if write_error:
        block["scaleWriteError"] = write_error
    return block


def merge_conditions(
    old: Sequence[Mapping[str, Any]] | None, new: Sequence[Condition], now_iso: str
) -> list[dict[str, Any]]:
    """The new conditions, each keeping its old transition time if its status is unchanged."""
    previous = {c.get("type"): c for c in old or ()}
    merged = []
    for condition in new:
        status = "True" if condition.status else "False"
        before = previous.get(condition.type)
        unchanged = before is not None and before.get("status") == status
        since = before.get("lastTransitionTime") if unchanged and before else None
        merged.append(
            {
                "type": condition.type,
                "status": status,
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": since or now_iso,
            }
        )
    return merged
