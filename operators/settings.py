"""Settings of the operator process (env prefix ``IRIS_OPERATOR_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from iris import metrics
from iris.settings import ServiceSettings


class OperatorSettings(ServiceSettings):
    """Read once at start by `iris operator` and passed to the handlers through kopf's memo."""

    model_config = SettingsConfigDict(env_prefix="IRIS_OPERATOR_", extra="forbid")

    namespace: str = "default"  # the one namespace watched (the RBAC is a namespaced Role)
    metrics_port: int = Field(default=metrics.OPERATOR_METRICS_PORT, ge=0, le=65535)
    interval_s: float = Field(default=15.0, gt=0, le=3600)  # one reconcile per autoscaler
    scrape_timeout_s: float = Field(default=2.0, gt=0, le=60)
    # The most a pod's /metrics answer may be; a larger one is a failed scrape.
    scrape_max_bytes: int = Field(default=1 << 20, gt=0)
    # The label ("key=value") a Deployment must carry to be scaled: the release's. The
    # chart sets app.kubernetes.io/instance=<release>.
    owner_label: str = "app.kubernetes.io/part-of=iris"
    # Talk to this API server URL without credentials (``kubectl proxy``, tests); empty:
    # in-cluster service account, else the local kubeconfig.
    api_server: str | None = None
