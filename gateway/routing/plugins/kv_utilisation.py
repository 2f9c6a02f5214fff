"""Scorer `kv-utilisation`: more free KV cache scores higher (1 - utilisation)."""

from __future__ import annotations

from gateway.routing.plugins.base import Scorer, register


@register
class KVUtilisation(Scorer):
    type = "kv-utilisation"

    def score(self, request, pods, index):
        return [1.0 - pod.load.kv_utilisation for pod in pods]
