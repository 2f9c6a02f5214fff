"""The chart's CRD is operators/crd.yaml byte for byte; its schema accepts the autoscaler the
chart renders and refuses broken ones; the operator's Role is operators/rbac.yaml's."""

from __future__ import annotations

import copy

import jsonschema
import pytest
import yaml

from tests.helm.chart import CHART, REPO, by_kind, crd_validator

OPERATOR_CRD = REPO / "operators" / "crd.yaml"
OPERATOR_RBAC = REPO / "operators" / "rbac.yaml"


def test_chart_crd_is_the_operators_crd():
    # helm/iris/crds/ cannot reference a file outside the chart, so it holds a copy:
    # after changing operators/crd.yaml, run
    #   cp operators/crd.yaml helm/iris/crds/irisautoscaler.yaml
    chart_crd = CHART / "crds" / "irisautoscaler.yaml"
    assert chart_crd.read_bytes() == OPERATOR_CRD.read_bytes(), (
        "helm/iris/crds/irisautoscaler.yaml differs from operators/crd.yaml"
    )


@pytest.fixture(scope="module")
def autoscaler(render) -> dict:
    (resource,) = by_kind(render(), "IrisAutoscaler").values()
    return resource


@pytest.mark.parametrize("scenario", ["default", "full"])
def test_schema_accepts_the_rendered_autoscaler(render, scenario):
    (resource,) = by_kind(render(scenario), "IrisAutoscaler").values()
    crd_validator().validate(resource)


def test_rendered_autoscaler_points_at_the_release(render, autoscaler):
    deployments = by_kind(render(), "Deployment")
    for pool in ("llm", "encoder"):
        spec = autoscaler["spec"][pool]
        target = deployments[spec["deployment"]]
        assert target["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
        (container,) = target["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert spec["metricsPort"] == ports["metrics"]


def _broken(resource: dict, path: list, value) -> dict:
    broken = copy.deepcopy(resource)
    node = broken
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return broken


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (["spec", "llm", "maxReplicas"], _DELETE),
        (["spec", "encoder"], _DELETE),
        (["spec", "llm", "minReplicas"], 0),
        (["spec", "llm", "targets", "kvUtilisation"], 1.5),
        (["spec", "llm", "targets", "kvUtilisation"], 0),
        (["spec", "encoder", "targets", "busyRatio"], "high"),
        (["spec", "llm", "deployment"], "Not_A_Name"),
        (["spec", "llm", "selector", "matchLabels"], {}),
        (["spec", "tolerance"], 0.95),
        (["spec", "scaleUp", "maxStep"], 0),
        (["spec", "llm", "targets", "kvUtilization"], 0.5),
        (["spec", "replicas"], 3),
    ],
)
def test_schema_refuses_a_broken_autoscaler(autoscaler, path, value):
    with pytest.raises(jsonschema.ValidationError):
        crd_validator().validate(_broken(autoscaler, path, value))


def test_operator_role_is_operators_rbac(render):
    expected = next(
        doc for doc in yaml.safe_load_all(OPERATOR_RBAC.read_text()) if doc["kind"] == "Role"
    )
    (role,) = [r for name, r in by_kind(render(), "Role").items() if name.endswith("-operator")]

    def normalised(rules: list[dict]) -> list:
        return sorted(
            (
                tuple(sorted(r["apiGroups"])),
                tuple(sorted(r["resources"])),
                tuple(sorted(r["verbs"])),
            )
            for r in rules
        )

    assert normalised(role["rules"]) == normalised(expected["rules"])
    # No cluster-wide rights: the operator watches its own namespace only.
    assert not by_kind(render(), "ClusterRole") and not by_kind(render(), "ClusterRoleBinding")
