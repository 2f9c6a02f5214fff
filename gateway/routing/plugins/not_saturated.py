"""Filter `not-saturated`: pods below a waiting-queue and a KV-utilisation limit."""

from __future__ import annotations

from gateway.routing.plugins.base import Filter, register


@register
class NotSaturated(Filter):
    type = "not-saturated"
    empty_status = 429  # every pod is busy: the client should come back later

    def __init__(self, max_waiting: int = 128, max_kv_utilisation: float = 0.97) -> None:
        if max_waiting < 0 or not 0 < max_kv_utilisation <= 1:
            raise ValueError(
                f"max_waiting must be >= 0 and max_kv_utilisation in (0, 1], got "
                f"{max_waiting}, {max_kv_utilisation}"
            )
        self.max_waiting = max_waiting
        self.max_kv_utilisation = max_kv_utilisation

    def filter(self, request, pods, index):
        return [
            pod
            for pod in pods
            if pod.load.waiting <= self.max_waiting
            and pod.load.kv_utilisation < self.max_kv_utilisation
        ]
