"""Scorer `prefix`: the share of the prompt's reusable blocks the pod already holds."""

from __future__ import annotations

from gateway.routing.plugins.base import Scorer, register


@register
class PrefixOverlap(Scorer):
    type = "prefix"

    def score(self, request, pods, index):
        scores = []
        for pod in pods:
            matched, total = request.matched_blocks(pod, index)
            scores.append(matched / total if total else 0.0)
        return scores
