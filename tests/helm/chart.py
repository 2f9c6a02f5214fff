"""Helpers of the chart tests: where things are, running helm, picking manifests apart."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "iris"
VALUES_DIR = Path(__file__).resolve().parent / "values"
# The Kubernetes version the chart is rendered for and validated against (its schemas ship
# with kubernetes-validate; the chart's floor is 1.27, for gRPC probes).
KUBE_VERSION = "1.31.0"
RELEASE = "demo"
NAMESPACE = "serving"
SCENARIOS = ["default"] + sorted(path.stem for path in VALUES_DIR.glob("*.yaml"))
CRD_PATH = CHART / "crds" / "irisautoscaler.yaml"


def find_helm() -> str | None:
    """The helm binary scripts/setup.sh installs (.tools/helm), else one on PATH."""
    local = REPO / ".tools" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("helm")


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess:
    """Run helm offline with its caches in a throwaway place; never raises on failure."""
    env = dict(
        os.environ, HELM_CACHE_HOME="/tmp/iris-helm/cache", HELM_CONFIG_HOME="/tmp/iris-helm/config"
    )
    return subprocess.run([helm, *args], capture_output=True, text=True, env=env, timeout=60)


def template_args(scenario: str, *extra: str) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", KUBE_VERSION]
    if scenario != "default":
        args += ["-f", str(VALUES_DIR / f"{scenario}.yaml")]
    return args + list(extra)


def by_kind(manifests: list[dict], kind: str) -> dict[str, dict]:
    """The manifests of one kind, by metadata.name."""
    return {doc["metadata"]["name"]: doc for doc in manifests if doc["kind"] == kind}


def component_of(manifest: dict) -> str | None:
    return manifest["metadata"].get("labels", {}).get("app.kubernetes.io/component")


def workloads(manifests: list[dict]) -> dict[str, dict]:
    """Deployments and StatefulSets, by their component label."""
    return {
        component_of(doc): doc for doc in manifests if doc["kind"] in ("Deployment", "StatefulSet")
    }


def containers(workload: dict, init: bool = True) -> list[dict]:
    spec = workload["spec"]["template"]["spec"]
    return list(spec.get("initContainers", []) if init else []) + list(spec["containers"])


def env_of(container: dict) -> dict[str, dict]:
    """A container's env entries by name (each the whole entry: value or valueFrom)."""
    return {entry["name"]: entry for entry in container.get("env", [])}


def load_values(scenario: str) -> dict:
    """The chart's default values merged with a scenario file (dicts merge, the rest replaces)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if scenario != "default":
        merge(values, yaml.safe_load((VALUES_DIR / f"{scenario}.yaml").read_text()))
    return values


def merge(base: dict, override: dict) -> None:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value


def crd_validator() -> jsonschema.Validator:
    """The IrisAutoscaler schema (OpenAPI v3.0: boolean exclusiveMinimum, hence draft 4)."""
    crd = yaml.safe_load(CRD_PATH.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft4Validator(schema)
