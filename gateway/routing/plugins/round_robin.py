"""Picker `round-robin`: each candidate in turn, scores ignored."""

from __future__ import annotations

from gateway.routing.plugins.base import Picker, register


@register
class RoundRobin(Picker):
    type = "round-robin"

    def __init__(self) -> None:
        self._turn = -1

    def pick(self, pods, scores):
        self._turn += 1
        ordered = sorted(pods, key=lambda pod: pod.address)
        return ordered[self._turn % len(ordered)]
