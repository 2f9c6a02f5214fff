"""Picker `max-score`: the best total; ties go round the tied pods in turn."""

from __future__ import annotations

from gateway.routing.plugins.base import Picker, register


@register
class MaxScore(Picker):
    type = "max-score"

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, pods, scores):
        best = max(scores)
        # A small tolerance so float noise in weighted sums does not break ties.
        tied = [pod for pod, score in zip(pods, scores, strict=True) if score >= best - 1e-9]
        self._turn += 1
        return tied[self._turn % len(tied)]
