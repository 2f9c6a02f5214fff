"""Filter `healthy`: pods that answered their last poll and were not refused."""

from __future__ import annotations

from gateway.routing.plugins.base import Filter, register


@register
class Healthy(Filter):
    type = "healthy"
    empty_status = 503

    def filter(self, request, pods, index):
        return [pod for pod in pods if pod.usable]
