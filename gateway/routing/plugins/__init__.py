"""Routing plugins, one per file, each registered under its `type` name."""

from gateway.routing.plugins import (  # noqa: F401  (importing registers them)
    estimated_ttft,
    estimated_wait,
    healthy,
    kv_utilisation,
    max_score,
    not_saturated,
    prefix,
    queue_depth,
    random_picker,
    round_robin,
)
from gateway.routing.plugins.base import PLUGINS, create_plugin

__all__ = ["PLUGINS", "create_plugin"]
