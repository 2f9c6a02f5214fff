"""Reading a started service's Prometheus /metrics page (benchmarks and end-to-end tests)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def metrics_url(service) -> str:
    """A service's /metrics URL: the metrics port `iris up` registered for it
    (iris.up.platform.Service; every Iris service, the gateway included, has its own)."""
    host = service.address.rpartition(":")[0]
    return f"http://{host}:{service.metrics_port}/metrics"


def scrape(url: str, labels: dict[str, str] | None = None) -> dict[str, float]:
    """Every sample on a /metrics page, by name, summed over labels; with `labels`, only
    the samples that carry those label values."""
    wanted = (labels or {}).items()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for sample in family.samples:
            if wanted <= sample.labels.items():
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values
