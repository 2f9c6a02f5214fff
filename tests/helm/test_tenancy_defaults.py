"""The chart isolates keys by default (`helm template`): per-key tenancy whenever API keys
are required, rate limits shared out between gateway replicas, DNS egress only to the
cluster DNS, and install notes that warn about plaintext services, shared tenancy and an
open Kubernetes API egress."""

from __future__ import annotations

from tests.helm.chart import by_kind, containers, env_of, workloads
from tests.helm.netpol import Endpoint, allowed
from tests.helm.test_networkpolicy import pods
from tests.helm.test_trust import notes


def gateway_env(manifests) -> dict[str, str]:
    gateway = containers(workloads(manifests)["gateway"], init=False)[0]
    return {name: entry.get("value") for name, entry in env_of(gateway).items()}


def test_tenancy_is_per_key_when_keys_are_required(render):
    assert gateway_env(render())["IRIS_GATEWAY_TENANCY"] == "per-key"
    assert gateway_env(render("full"))["IRIS_GATEWAY_TENANCY"] == "per-key"  # listed keys
    open_gateway = render("default", "--set", "gateway.apiKeys.required=false")
    assert gateway_env(open_gateway)["IRIS_GATEWAY_TENANCY"] == "shared"
    chosen = render("default", "--set", "gateway.tenancy=shared")
    assert gateway_env(chosen)["IRIS_GATEWAY_TENANCY"] == "shared"


def test_rate_limits_are_divided_between_the_replicas(render):
    env = gateway_env(render("default", "--set", "gateway.replicas=4"))
    assert env["IRIS_GATEWAY_KEY_REQUESTS_PER_S"] == "5"  # 20 / 4
    assert env["IRIS_GATEWAY_KEY_REQUEST_BURST"] == "10"
    assert env["IRIS_GATEWAY_KEY_PROMPT_TOKENS_PER_S"] == "12500"
    assert env["IRIS_GATEWAY_KEY_COMPLETION_TOKENS_PER_S"] == "5000"
    assert env["IRIS_GATEWAY_KEY_COMPLETION_TOKENS_BURST"] == "25000"
    env = gateway_env(render("default", "--set", "gateway.replicas=3"))
    assert abs(float(env["IRIS_GATEWAY_KEY_REQUESTS_PER_S"]) - 20 / 3) < 1e-3


def test_dns_egress_goes_only_to_the_cluster_dns(render):
    manifests = render()
    policies = list(by_kind(manifests, "NetworkPolicy").values())
    dns = Endpoint(
        "kube-system", {"k8s-app": "kube-dns"}, {"kubernetes.io/metadata.name": "kube-system"}
    )
    elsewhere = Endpoint(None, ip="8.8.8.8")
    impostor = Endpoint(
        "serving", {"k8s-app": "kube-dns"}, {"kubernetes.io/metadata.name": "serving"}
    )
    for component, pod in pods(manifests).items():
        if component == "redis":
            continue
        assert allowed(policies, pod, dns, 53, "Egress", "UDP"), component
        assert not allowed(policies, pod, elsewhere, 53, "Egress", "UDP"), component
        assert not allowed(policies, pod, impostor, 53, "Egress", "TCP"), component


def test_notes_guide_tenancy_and_warn_about_open_defaults(helm, tmp_path):
    text = notes(helm, tmp_path)
    assert "Tenancy: per-key" in text and "gateway.tenancy=shared" in text
    assert "WARNING: tls.enabled is false" in text and "any pod in namespace" in text
    assert "WARNING: networkPolicy.kubeApi.cidrs is 0.0.0.0/0" in text
    assert "divided by gateway.replicas" in text
    shared = notes(helm, tmp_path / "b", "--set", "gateway.tenancy=shared")
    assert 'WARNING: gateway.tenancy is "shared"' in shared
    closed = notes(
        helm,
        tmp_path / "c",
        "--set",
        "tls.enabled=true",
        "--set",
        "networkPolicy.kubeApi.cidrs={10.0.0.1/32}",
    )
    assert "WARNING" not in closed


def test_the_operator_scales_only_the_release_deployments(render):
    manifests = render()
    operator = containers(workloads(manifests)["operator"], init=False)[0]
    owner = env_of(operator)["IRIS_OPERATOR_OWNER_LABEL"]["value"]
    key, value = owner.split("=")
    deployments = by_kind(manifests, "Deployment")
    for autoscaler in by_kind(manifests, "IrisAutoscaler").values():
        for pool in ("llm", "encoder"):
            target = deployments[autoscaler["spec"][pool]["deployment"]]
            assert target["metadata"]["labels"][key] == value
