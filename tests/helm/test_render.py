"""Every scenario renders, and every object it renders is valid for Kubernetes.

Built-in kinds are checked against the Kubernetes JSON schemas that kubernetes-validate ships
(offline, strict: unknown fields are errors); IrisAutoscaler against the CRD in the chart;
ServiceMonitor and PrometheusRule (Prometheus Operator CRDs not available offline) against the
few fields of their specs the chart uses; cert-manager's Certificate and Issuer against the
models of a package generated from cert-manager's CRDs (tests/helm/cert_manager.py).
"""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.helm.cert_manager import KINDS as CERT_MANAGER_KINDS
from tests.helm.cert_manager import validate_cert_manager
from tests.helm.chart import CRD_PATH, KUBE_VERSION, SCENARIOS, by_kind, crd_validator, workloads

# The ServiceMonitor fields the chart sets (monitoring.coreos.com/v1), nothing more.
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "namespaceSelector": {
                    "type": "object",
                    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                    "additionalProperties": False,
                },
                "selector": {"type": "object"},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                        },
                    },
                },
            },
        },
    },
}

# The PrometheusRule fields the chart sets (monitoring.coreos.com/v1), nothing more.
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
PROMETHEUS_RULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
                                    "additionalProperties": False,
                                    "properties": {
                                        "record": {"type": "string"},
                                        "alert": {"type": "string"},
                                        "expr": {"type": "string"},
                                        "for": {"type": "string", "pattern": "^[0-9]+(s|m|h|d)$"},
                                        "labels": _STRINGS,
                                        "annotations": _STRINGS,
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def validate(manifest: dict) -> None:
    kind = manifest["kind"]
    if kind == "IrisAutoscaler":
        crd_validator().validate(manifest)
    elif kind == "ServiceMonitor":
        jsonschema.Draft7Validator(SERVICE_MONITOR_SCHEMA).validate(manifest)
    elif kind == "PrometheusRule":
        jsonschema.Draft7Validator(PROMETHEUS_RULE_SCHEMA).validate(manifest)
    elif kind in CERT_MANAGER_KINDS:
        validate_cert_manager(manifest)
    else:
        kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_manifest_validates(render, scenario):
    manifests = render(scenario)
    assert len(manifests) > 10
    for manifest in manifests:
        try:
            validate(manifest)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as err:
            name = f"{manifest['kind']}/{manifest['metadata']['name']}"
            pytest.fail(
                f"{scenario}: {name} is invalid at {list(err.absolute_path)}: {err.message}"
            )
        except ValueError as err:  # cert-manager objects (pydantic's error is a ValueError)
            name = f"{manifest['kind']}/{manifest['metadata']['name']}"
            pytest.fail(f"{scenario}: {name} is invalid: {err}")


def test_crd_itself_validates():
    kubernetes_validate.validate(yaml.safe_load(CRD_PATH.read_text()), KUBE_VERSION, strict=True)


def test_strict_validation_catches_a_typo(render):
    """The validator is not vacuous: a misspelt field in a rendered Deployment is refused."""
    deployment = dict(next(iter(by_kind(render(), "Deployment").values())))
    deployment["spec"] = dict(deployment["spec"], replica=2)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)


def test_default_release_has_every_part(render):
    manifests = render()
    assert set(workloads(manifests)) == {"gateway", "encoder", "cache", "llm", "redis", "operator"}
    kinds = {doc["kind"] for doc in manifests}
    assert {
        "Service",
        "ConfigMap",
        "Secret",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "IrisAutoscaler",
        "StatefulSet",
    } <= kinds
    # The ServiceMonitor is opt-in; the CRD itself comes from crds/, never from templates.
    assert "ServiceMonitor" not in kinds
    assert "PrometheusRule" not in kinds
    assert "CustomResourceDefinition" not in kinds


def test_minimal_release_leaves_out_the_optional_parts(render):
    manifests = render("minimal")
    assert set(workloads(manifests)) == {"gateway", "encoder", "cache", "llm"}
    kinds = {doc["kind"] for doc in manifests}
    for absent in ("NetworkPolicy", "IrisAutoscaler", "StatefulSet", "ServiceAccount"):
        assert absent not in kinds
    assert set(by_kind(manifests, "PodDisruptionBudget")) == {
        "demo-iris-encoder",
        "demo-iris-cache",
        "demo-iris-llm",
    }
