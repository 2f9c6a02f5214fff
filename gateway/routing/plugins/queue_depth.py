"""Scorer `queue-depth`: fewer waiting requests score higher, min-max scaled over the
candidates (all equal → all 1)."""

from __future__ import annotations

from gateway.routing.plugins.base import Scorer, register


@register
class QueueDepth(Scorer):
    type = "queue-depth"

    def score(self, request, pods, index):
        depths = [pod.load.waiting + pod.load.running for pod in pods]
        low, high = min(depths, default=0), max(depths, default=0)
        if high == low:
            return [1.0] * len(pods)
        return [1.0 - (depth - low) / (high - low) for depth in depths]
