"""The operator as a real `iris operator` process, against kmock served from a thread.

No real API server can run on these machines (see tests/operators/test_operator_kmock.py):
kmock stands in for it, on a real loopback HTTP port, in its own event loop in a thread of
the test process. The operator is a separate process so that its /metrics page carries its
own metrics only (the test process's default registry also holds in-process services').
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import httpx
import kmock as kmocklib

from iris.up.processes import ChildProcess, free_port, wait_until
from tests.operators.kmock_api import NS, declare_resources


def pod(name: str, ip: str, component: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"app.kubernetes.io/name": "iris", "app.kubernetes.io/component": component},
        },
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def deployment(name: str, replicas: int) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        # The operator scales only Deployments carrying its owner label (its default here).
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"app.kubernetes.io/part-of": "iris"},
        },
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas},
    }


def autoscaler(llm_metrics_port: int, encoder_metrics_port: int) -> dict:
    def part(kind: str, port: int, max_replicas: int) -> dict:
        return {
            "deployment": f"iris-{kind}",
            "selector": {"matchLabels": {"app.kubernetes.io/component": kind}},
            "minReplicas": 1,
            "maxReplicas": max_replicas,
            "metricsPort": port,
        }

    return {
        "apiVersion": "iris.dev/v1alpha1",
        "kind": "IrisAutoscaler",
        "metadata": {"name": "pair", "namespace": NS, "generation": 1, "resourceVersion": "1"},
        "spec": {
            "llm": part("llm", llm_metrics_port, 4),
            "encoder": part("encoder", encoder_metrics_port, 4),
            "scaleDown": {"stabilisationSeconds": 0, "maxStep": 1},
            "scaleUp": {"stabilisationSeconds": 0, "maxStep": 4},
        },
    }


class KubeEmulator:
    """kmock serving on loopback from a daemon thread; `objects` are put in before start."""

    def __init__(self, objects: dict[tuple[str, str, str], dict]) -> None:
        self.objects = objects
        self.url: str | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with kmocklib.KubernetesEmulator() as k8s, kmocklib.Server(k8s):
            declare_resources(k8s)
            for key, body in self.objects.items():
                k8s.objects[key] = body
            self.url = str(k8s.url)
            self._ready.set()
            await self._stop.wait()

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("kmock did not start in 30 s")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def start_operator(api_server: str, log_dir: Path) -> tuple[ChildProcess, str]:
    """`iris operator` on a fresh metrics port, started (not waited for: see
    wait_operator); returns it and host:port of its /metrics."""
    port = free_port()
    child = ChildProcess(
        name="operator",
        argv=[sys.executable, "-m", "iris.cli", "operator"],
        env={
            "IRIS_OPERATOR_API_SERVER": api_server,
            "IRIS_OPERATOR_NAMESPACE": NS,
            "IRIS_OPERATOR_HOST": "127.0.0.1",
            "IRIS_OPERATOR_METRICS_PORT": str(port),
            "IRIS_OPERATOR_INTERVAL_S": "0.5",
            "IRIS_OPERATOR_SCRAPE_TIMEOUT_S": "10",
            "PYTHONUNBUFFERED": "1",
        },
        log_path=log_dir / "operator.log",
    )
    child.start()
    return child, f"127.0.0.1:{port}"


def wait_operator(child: ChildProcess, address: str, timeout_s: float = 60.0) -> None:
    """Until the operator's /metrics answers; RuntimeError with its log if it exits."""

    def answers() -> bool:
        if not child.running():
            raise RuntimeError(f"iris operator exited:\n{child.tail(20)}")
        try:
            return httpx.get(f"http://{address}/metrics", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    if not wait_until(answers, timeout_s, 0.1):
        raise RuntimeError(
            f"iris operator's /metrics not up in {timeout_s:.0f} s:\n{child.tail(20)}"
        )
