"""values.yaml against iris/, the scenario files against values.yaml, and bad values refused
(by values.schema.json or templates/_validations.tpl) with the value's path in the message."""

from __future__ import annotations

import json

import pytest
import yaml

from iris import metrics
from tests.helm.chart import CHART, VALUES_DIR, run_helm

VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
# Keys whose value is free-form (passed through to Kubernetes or the gateway as a whole):
# a scenario sets them as a whole, not key by key.
FREE_FORM = {
    "podSecurityContext",
    "containerSecurityContext",
    "resources",
    "nodeSelector",
    "tolerations",
    "affinity",
    "annotations",
    "podAnnotations",
    "labels",
    "router",
    "extraEnv",
    "imagePullSecrets",
    "namespaceSelector",
    "podSelector",
    "targets",
}


def leaf_paths(values: dict, prefix: str = "") -> set[str]:
    paths = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in FREE_FORM:
            paths |= leaf_paths(value, path + ".")
        else:
            paths.add(path)
    return paths


def test_ports_are_the_ones_in_iris_metrics():
    assert VALUES["gateway"]["port"] == metrics.GATEWAY_HTTP_PORT
    assert VALUES["gateway"]["metricsPort"] == metrics.GATEWAY_METRICS_PORT
    for service in ("encoder", "cache", "llm"):
        assert VALUES[service]["port"] == metrics.DEFAULT_PORTS[service]
        assert VALUES[service]["metricsPort"] == metrics.METRICS_PORTS[service]
    assert VALUES["operator"]["metricsPort"] == metrics.OPERATOR_METRICS_PORT


def test_scenarios_together_set_every_option():
    covered: set[str] = set()
    for path in VALUES_DIR.glob("*.yaml"):
        scenario = yaml.safe_load(path.read_text())
        covered |= leaf_paths(scenario)
        # A scenario key must be one the chart knows (a typo would be silently unused).
        unknown = {p for p in leaf_paths(scenario) if not _known(p)}
        assert not unknown, f"{path.name} sets keys the chart does not have: {sorted(unknown)}"
    missing = {
        path
        for path in leaf_paths(VALUES)
        if not any(c == path or c.startswith(path + ".") for c in covered)
    }
    assert not missing, f"no scenario in tests/helm/values sets: {sorted(missing)}"


def _known(path: str) -> bool:
    """Whether values.schema.json declares the key (below a free-form object, anything goes)."""
    node = SCHEMA
    for part in path.split("."):
        if "properties" not in node:
            return True
        if part not in node["properties"]:
            return False
        node = node["properties"][part]
    return True


def test_schema_covers_every_key():
    """values.schema.json forbids unknown keys, so every key of values.yaml must be in it."""

    def walk(values: dict, node: dict, prefix: str) -> None:
        for key, value in values.items():
            assert key in node.get("properties", {}), f"{prefix}{key} is not in values.schema.json"
            child = node["properties"][key]
            if isinstance(value, dict) and child.get("properties"):
                walk(value, child, f"{prefix}{key}.")

    walk(VALUES, SCHEMA, "")


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        (["--set", "model.source=s3"], "model.source"),
        (["--set", "gateway.discovery=dns"], "gateway.discovery"),
        (["--set", "cache.store=disk"], "cache.store"),
        (["--set", "encoder.port=70000"], "encoder.port"),
        (["--set", "llm.device=tpu"], "llm.device"),
        (["--set", "gateway.replicaz=2"], "replicaz"),
        (
            ["--set", "autoscaler.llm.targets.kvUtilisation=1.5"],
            "autoscaler.llm.targets.kvUtilisation",
        ),
        (["--set", "redis.external.url=http://redis:6379"], "redis.external.url"),
        (["--set", "redisCluster.nodes={redis-0}"], "redisCluster.nodes"),
    ],
)
def test_schema_refuses_bad_values(render_error, overrides, path):
    assert path in render_error("default", *overrides)


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        (["--set", "model.pvc.claimName="], "model.pvc.claimName"),
        (["--set", "model.source=hostPath"], "model.hostPath.path"),
        (["--set", "model.source=image"], "model.image.repository"),
        (["--set", "redis.enabled=false"], "redis.external.url"),
        (["--set", "cache.store=memory", "--set", "cache.replicas=2"], "cache.replicas"),
        (
            ["--set", "cache.store=redis-cluster", "--set", "redis.enabled=false"],
            "redisCluster.nodes",
        ),
        (
            ["--set", "cache.store=redis-cluster", "--set", "redisCluster.nodes={a:1}"],
            "redis.enabled",
        ),
        (["--set", "operator.enabled=false"], "autoscaler.enabled"),
        (["--set", "autoscaler.llm.minReplicas=9"], "autoscaler.llm.minReplicas"),
        (
            ["--set", "gateway.apiKeys.existingSecret=s", "--set", "gateway.apiKeys.keys={a}"],
            "gateway.apiKeys",
        ),
        (
            ["--set", "redis.auth.existingSecret=s", "--set", "redis.auth.password=p"],
            "redis.auth",
        ),
    ],
)
def test_validations_name_the_value(render_error, overrides, path):
    assert path in render_error("default", *overrides)


@pytest.mark.parametrize(
    "scenario", ["default", "full", "external-redis", "minimal", "redis-cluster"]
)
def test_lint_strict(helm, scenario):
    args = ["lint", "--strict", str(CHART)]
    if scenario != "default":
        args += ["-f", str(VALUES_DIR / f"{scenario}.yaml")]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout
