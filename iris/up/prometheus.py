"""A real Prometheus beside a local platform: its scrape configuration and its process.

`scrape_config` is the one place that turns `iris up`'s list of services into scrape
targets: the dashboard test and `iris up --prometheus` both use it. Each service's metrics
address is the one `iris up` registered for it (`Service.metrics_port`; every Iris service,
the gateway included, serves /metrics on a port of its own; Redis has none).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import httpx
import yaml

from iris.up.processes import ChildProcess, free_port, wait_until

HOST = "127.0.0.1"
# The namespace label a ServiceMonitor would add; dashboards select on it.
LOCAL_NAMESPACE = "iris-up"
REPO = Path(__file__).resolve().parents[2]
TOOLS_DIR = REPO / ".tools"
# The chart's rules, loaded as they are (the plain file promtool checks).
RULES_FILE = REPO / "helm" / "iris" / "rules" / "iris.rules.yaml"


def find_tool(name: str) -> str | None:
    """`prometheus` or `promtool`: on PATH, else in the checkout's .tools/ (where
    scripts/setup.sh unpacks Debian's package)."""
    found = shutil.which(name)
    if found:
        return found
    local = TOOLS_DIR / name
    return str(local) if local.is_file() else None


def metrics_address(service) -> str | None:
    """host:port where `service` (an `iris.up.platform.Service`) serves /metrics, or None
    for a service without metrics (Redis)."""
    if service.metrics_port is None:
        return None
    host = service.address.rpartition(":")[0]
    return f"{host}:{service.metrics_port}"


def scrape_config(
    services: Iterable,
    *,
    operator_address: str | None = None,
    interval_s: float = 1.0,
    namespace: str = LOCAL_NAMESPACE,
    rule_files: Sequence[str | Path] = (),
) -> dict:
    """A prometheus.yml (as a dict) scraping every service with metrics, one job per kind,
    each target labelled `namespace` and `pod` (the service's name) as a ServiceMonitor
    would label it; the operator, if given, is job `operator`, pod `operator`."""
    targets: dict[str, list[tuple[str, str]]] = {}
    for service in services:
        address = metrics_address(service)
        if address is not None:
            targets.setdefault(service.kind, []).append((service.name, address))
    if operator_address is not None:
        targets.setdefault("operator", []).append(("operator", operator_address))
    interval = f"{max(interval_s, 0.1):g}s"
    jobs = [
        {
            "job_name": kind,
            "metrics_path": "/metrics",
            "static_configs": [
                {"targets": [address], "labels": {"namespace": namespace, "pod": pod}}
                for pod, address in pods
            ],
        }
        for kind, pods in targets.items()
    ]
    config: dict = {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        "scrape_configs": jobs,
    }
    if rule_files:
        config["rule_files"] = [str(path) for path in rule_files]
    return config


class PrometheusMissing(RuntimeError):
    """No prometheus binary was found (the message says how to get one)."""


class Prometheus:
    """A Prometheus server process on a free loopback port with a scratch TSDB.

    Use as a context manager, or call start() / stop()."""

    def __init__(self, config: dict, work_dir: Path | None = None, port: int | None = None):
        binary = find_tool("prometheus")
        if binary is None:
            raise PrometheusMissing(
                "prometheus not found on PATH nor in .tools/ (scripts/setup.sh unpacks "
                "Debian's prometheus 2.42 there)"
            )
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="iris-prometheus-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.interval = config.get("global", {}).get("scrape_interval", "1m")
        self.targets = sum(
            len(group["targets"])
            for job in config.get("scrape_configs", [])
            for group in job.get("static_configs", [])
        )
        config_path = self.work_dir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        # One client for every call: a fresh httpx client per query costs more than the query.
        self._http = httpx.Client(timeout=30.0)
        self.child = ChildProcess(
            name="prometheus",
            argv=[
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self.work_dir / 'data'}",
                f"--web.listen-address={HOST}:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            log_path=self.work_dir / "prometheus.log",
        )

    def start(self, timeout_s: float = 60.0) -> None:
        """Start it and wait until it is ready (see wait_ready)."""
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self) -> None:
        """Start the process without waiting (to overlap its start with the platform's)."""
        self.child.start()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until /-/ready answers and every configured target is active (Prometheus
        syncs its targets a few seconds after it starts); else stop it and raise with its
        log's tail."""

        def ready_with_targets() -> bool:
            return self.ready() and self.active_targets() == self.targets

        if not wait_until(ready_with_targets, timeout_s, 0.1):
            self.stop()
            raise RuntimeError(
                f"prometheus not ready after {timeout_s:.0f}s; its log: "
                f"{self.child.log_path}\n{self.child.tail(12)}"
            )

    def ready(self) -> bool:
        if not self.child.running():
            raise RuntimeError(f"prometheus exited; its log:\n{self.child.tail(12)}")
        try:
            return self._http.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def active_targets(self) -> int:
        return len(self.api("targets")["activeTargets"])

    def api(self, path: str, **params) -> dict | list:
        """GET /api/v1/<path>; the `data` of a successful answer, else RuntimeError."""
        reply = self._http.get(f"{self.url}/api/v1/{path}", params=params)
        body = reply.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query's result vector (or scalar, as a one-element list)."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self.api("query", **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def stop(self) -> None:
        self.child.stop()
        self._http.close()

    def __enter__(self) -> Prometheus:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def prometheus_beside(
    services: Iterable,
    work_dir: Path,
    *,
    interval_s: float = 5.0,
    operator_address: str | None = None,
) -> Prometheus:
    """The Prometheus `iris up --prometheus` runs (not started yet): scraping `services`
    (and the operator, if given) with the chart's recording and alert rules loaded.
    PrometheusMissing if there is no binary."""
    rules = [RULES_FILE] if RULES_FILE.is_file() else []
    config = scrape_config(
        services, operator_address=operator_address, interval_s=interval_s, rule_files=rules
    )
    return Prometheus(config, work_dir)


def start_beside_platform(platform, echo: Callable[..., None]) -> Callable[[], None]:
    """`iris up --prometheus`: start Prometheus beside a running platform and `echo` its
    URL; without a binary (or if it does not start) say why and serve on without it.
    Returns what stops it."""
    try:
        server = prometheus_beside(platform.services, platform.log_dir / "prometheus")
    except PrometheusMissing as err:
        echo(f"iris up: --prometheus: {err}; serving without it", err=True)
        return lambda: None
    try:
        server.start()
    except RuntimeError as err:
        echo(f"iris up: --prometheus: {err}; serving without it", err=True)
        return server.stop
    echo(
        f"Prometheus: {server.url} (scraping every {server.interval}, with the chart's "
        f"recording and alert rules; e.g. {server.url}/api/v1/query?query=iris:ttft_seconds:p50)"
    )
    return server.stop
