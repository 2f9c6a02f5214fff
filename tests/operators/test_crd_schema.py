"""The CRD (operators/crd.yaml): custom resources checked against its openAPIV3Schema with
jsonschema (kmock, used by the operator tests, validates nothing), and the spec parser's
agreement with the schema (same defaults, same refusals)."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import kopf
import pytest
import yaml

from iris import metrics
from operators.spec import parse_spec

CRD_PATH = Path(__file__).resolve().parents[2] / "operators" / "crd.yaml"


@pytest.fixture(scope="module")
def crd() -> dict:
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture(scope="module")
def validator(crd) -> jsonschema.Draft4Validator:
    # Kubernetes' OpenAPI v3.0 schemas use draft-4 style boolean exclusiveMinimum.
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


GOOD = {
    "apiVersion": "iris.dev/v1alpha1",
    "kind": "IrisAutoscaler",
    "metadata": {"name": "pair"},
    "spec": {
        "llm": {
            "deployment": "iris-llm",
            "selector": {"matchLabels": {"app.kubernetes.io/component": "llm"}},
            "minReplicas": 1,
            "maxReplicas": 8,
            "targets": {"kvUtilisation": 0.8, "requestsWaiting": 2, "pendingPrefillTokens": 8192},
        },
        "encoder": {
            "deployment": "iris-encoder",
            "selector": {"matchLabels": {"app.kubernetes.io/component": "encoder"}},
            "maxReplicas": 4,
            "targets": {"queuedVisionTokens": 4096, "busyRatio": 0.7},
        },
        "tolerance": 0.1,
        "scaleUp": {"stabilisationSeconds": 0, "maxStep": 4},
        "scaleDown": {"stabilisationSeconds": 300, "maxStep": 1},
        "coupling": {"prefillTokensPerVisionToken": 1.2},
    },
}


def _with(path: str, value):
    body = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = body
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return body


_DELETE = object()

MINIMAL = {
    "spec": {
        "llm": {"deployment": "l", "selector": {"matchLabels": {"a": "l"}}, "maxReplicas": 2},
        "encoder": {"deployment": "e", "selector": {"matchLabels": {"a": "e"}}, "maxReplicas": 2},
    }
}


def test_crd_names_and_subresources(crd):
    assert crd["metadata"]["name"] == "irisautoscalers.iris.dev"
    assert crd["spec"]["group"] == "iris.dev"
    assert crd["spec"]["names"]["kind"] == "IrisAutoscaler"
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = {column["name"] for column in version["additionalPrinterColumns"]}
    assert {"LLM", "Encoder", "Ready", "Age"} <= columns


def test_crd_default_ports_are_the_metrics_constants(crd):
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    pools = props["properties"]
    assert pools["llm"]["properties"]["metricsPort"]["default"] == metrics.LLM_METRICS_PORT
    assert pools["encoder"]["properties"]["metricsPort"]["default"] == metrics.ENCODER_METRICS_PORT


@pytest.mark.parametrize("body", [GOOD, MINIMAL], ids=["full", "minimal"])
def test_good_resources_pass_schema_and_parser(validator, body):
    validator.validate(body)
    parse_spec(body["spec"])


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("spec.llm", _DELETE, "llm"),
        ("spec.llm.deployment", "Not_A_Name", "deployment"),
        ("spec.llm.selector", {"matchLabels": {}}, "matchLabels"),
        ("spec.llm.selector", {"matchExpressions": []}, "selector"),
        ("spec.llm.minReplicas", 0, "minReplicas"),
        ("spec.llm.maxReplicas", _DELETE, "maxReplicas"),
        ("spec.llm.maxReplicas", 1001, "maxReplicas"),
        ("spec.llm.maxReplicas", "8", "maxReplicas"),
        ("spec.llm.headroomReplicas", -1, "headroomReplicas"),
        ("spec.encoder.headroomReplicas", 1.5, "headroomReplicas"),
        ("spec.llm.targets", {"kvUtilisation": 1.5}, "kvUtilisation"),
        ("spec.llm.targets", {"kvUtilisation": 0}, "kvUtilisation"),
        ("spec.llm.targets", {"requestsWaiting": -1}, "requestsWaiting"),
        ("spec.llm.targets", {"queueDepth": 3}, "queueDepth"),
        ("spec.encoder.targets", {"busyRatio": 0}, "busyRatio"),
        ("spec.encoder.metricsPort", 70000, "metricsPort"),
        ("spec.tolerance", 0.95, "tolerance"),
        ("spec.scaleUp", {"maxStep": 0}, "maxStep"),
        ("spec.scaleDown", {"stabilisationSeconds": -5}, "stabilisationSeconds"),
        ("spec.coupling", {"prefillTokensPerVisionToken": -1}, "prefillTokensPerVisionToken"),
        ("spec.replicas", 3, "replicas"),
    ],
)
def test_bad_resources_fail_schema_and_parser(validator, path, value, field):
    body = _with(path, value)
    errors = list(validator.iter_errors(body))
    assert errors, f"schema accepted {path}={value!r}"
    with pytest.raises(kopf.PermanentError, match=field):
        parse_spec(body["spec"])


def test_min_above_max_passes_the_schema_but_not_the_parser(validator):
    body = _with("spec.llm.minReplicas", 9)
    validator.validate(body)  # a schema cannot compare two fields
    with pytest.raises(kopf.PermanentError, match=r"spec\.llm\.minReplicas: 9 is above"):
        parse_spec(body["spec"])


def test_parser_defaults(crd):
    spec = parse_spec(MINIMAL["spec"])
    assert spec.llm.min_replicas == 1
    assert spec.llm.metrics_port == metrics.LLM_METRICS_PORT
    assert spec.encoder.metrics_port == metrics.ENCODER_METRICS_PORT
    assert spec.scale_up.stabilisation_s == 0
    assert spec.scale_down.stabilisation_s == 300
    assert spec.scale_down.max_step == 1
    assert spec.prefill_tokens_per_vision_token == 1.0
    assert spec.llm.headroom == spec.encoder.headroom == 0
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert schema["properties"]["llm"]["properties"]["headroomReplicas"]["default"] == 0
    llm_targets = schema["properties"]["llm"]["properties"]["targets"]["properties"]
    assert llm_targets["kvUtilisation"]["default"] == spec.llm_targets.kv_utilisation
    assert llm_targets["requestsWaiting"]["default"] == spec.llm_targets.requests_waiting
    enc_targets = schema["properties"]["encoder"]["properties"]["targets"]["properties"]
    assert enc_targets["busyRatio"]["default"] == spec.encoder_targets.busy_ratio
    assert schema["properties"]["tolerance"]["default"] == spec.tolerance
