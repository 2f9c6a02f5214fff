"""The operator's own Prometheus metrics (names from iris.metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from iris import metrics

_POOL = [metrics.LABEL_DEPLOYMENT, metrics.LABEL_KIND]

DESIRED_REPLICAS = Gauge(metrics.OPERATOR_DESIRED_REPLICAS, "Replicas the policy decided", _POOL)
CURRENT_REPLICAS = Gauge(metrics.OPERATOR_CURRENT_REPLICAS, "Replicas the Deployment had", _POOL)
SCRAPE_FAILURES = Counter(
    metrics.OPERATOR_SCRAPE_FAILURES, "Pod /metrics reads that failed", [metrics.LABEL_POD]
)
SCALE_EVENTS = Counter(
    metrics.OPERATOR_SCALE_EVENTS,
    "Scale subresource patches",
    [metrics.LABEL_KIND, metrics.LABEL_REASON],
)
