"""The NetworkPolicies, evaluated (tests/helm/netpol.py) on the flows docs/design/index.md needs and
on the ones it must refuse: from outside the release only the gateway (and, from the
monitoring namespace, the metrics ports) is reachable; Redis only from the cache service."""

from __future__ import annotations

import pytest

from tests.helm.chart import NAMESPACE, by_kind, load_values, workloads
from tests.helm.netpol import Endpoint, allowed, flow

SCENARIOS = ["default", "full", "external-redis"]


def pods(manifests: list[dict]) -> dict[str, Endpoint]:
    """An Endpoint per component, carrying its pod template's labels."""
    return {
        component: Endpoint(NAMESPACE, workload["spec"]["template"]["metadata"]["labels"])
        for component, workload in workloads(manifests).items()
    }


def ports(values: dict) -> dict[str, dict[str, int]]:
    out = {
        "gateway": {"http": values["gateway"]["port"], "metrics": values["gateway"]["metricsPort"]}
    }
    for component in ("encoder", "cache", "llm"):
        out[component] = {
            "grpc": values[component]["port"],
            "metrics": values[component]["metricsPort"],
        }
    out["operator"] = {"metrics": values["operator"]["metricsPort"]}
    out["redis"] = {"redis": values["redis"]["port"]}
    return out


def monitoring_pod(values: dict) -> Endpoint:
    selector = values["networkPolicy"]["monitoring"]
    return Endpoint(
        "observability",
        dict(selector["podSelector"].get("matchLabels", {})),
        dict(selector["namespaceSelector"]["matchLabels"]),
    )


@pytest.fixture(params=SCENARIOS)
def case(request, render):
    manifests = render(request.param)
    values = load_values(request.param)
    policies = list(by_kind(manifests, "NetworkPolicy").values())
    return manifests, values, policies


def test_every_pod_is_isolated_both_ways(case):
    manifests, _, policies = case
    for component, pod in pods(manifests).items():
        for direction in ("Ingress", "Egress"):
            stranger = Endpoint("elsewhere", {"app": "stranger"}, {"name": "elsewhere"})
            # An arbitrary port no rule opens: refused means the pod is isolated.
            assert not allowed(policies, pod, stranger, 31337, direction), (component, direction)


def test_only_the_gateway_is_reachable_from_outside(case):
    manifests, values, policies = case
    release = pods(manifests)
    port_map = ports(values)
    ingress_from = values["networkPolicy"]["gatewayIngressFrom"]
    outsider = Endpoint("clients", {"app": "client"}, {"kubernetes.io/metadata.name": "clients"})
    internet = Endpoint(None, ip="203.0.113.7")
    for component, pod in release.items():
        for name, port in port_map[component].items():
            reachable = allowed(policies, pod, outsider, port, "Ingress")
            if (component, name) == ("gateway", "http") and not ingress_from:
                assert reachable and allowed(policies, pod, internet, port, "Ingress")
            else:
                assert not reachable, (component, name)
    if ingress_from:
        ingress = Endpoint(
            "ingress-nginx", {"app": "nginx"}, {"kubernetes.io/metadata.name": "ingress-nginx"}
        )
        assert allowed(
            policies, release["gateway"], ingress, port_map["gateway"]["http"], "Ingress"
        )


def test_metrics_ports_open_to_monitoring_only(case):
    manifests, values, policies = case
    release = pods(manifests)
    port_map = ports(values)
    monitor = monitoring_pod(values)
    open_http = not values["networkPolicy"]["gatewayIngressFrom"]  # open to everyone
    for component, pod in release.items():
        for name, port in port_map[component].items():
            expected = name == "metrics" or (name == "http" and open_http)
            got = allowed(policies, pod, monitor, port, "Ingress")
            assert got is expected, (component, name)


def test_service_flows(case):
    manifests, values, policies = case
    p = pods(manifests)
    port_map = ports(values)
    wanted = [
        ("gateway", "encoder", "grpc"),
        ("gateway", "cache", "grpc"),
        ("gateway", "llm", "grpc"),
        ("encoder", "cache", "grpc"),
        ("llm", "cache", "grpc"),
        ("operator", "encoder", "metrics"),
        ("operator", "llm", "metrics"),
    ]
    refused = [
        ("gateway", "encoder", "metrics"),
        ("encoder", "llm", "grpc"),
        ("llm", "encoder", "grpc"),
        ("cache", "llm", "grpc"),
        ("cache", "encoder", "grpc"),
        ("operator", "cache", "grpc"),
        ("encoder", "gateway", "http"),
        ("llm", "gateway", "http"),
    ]
    if "redis" in p:
        wanted.append(("cache", "redis", "redis"))
        refused += [(c, "redis", "redis") for c in ("gateway", "encoder", "llm", "operator")]
    for source, target, port in wanted:
        assert flow(policies, p[source], p[target], port_map[target][port]), (source, target)
    for source, target, port in refused:
        assert not flow(policies, p[source], p[target], port_map[target][port]), (source, target)


def test_redis_talks_to_nobody(render):
    manifests = render()
    policies = list(by_kind(manifests, "NetworkPolicy").values())
    redis = pods(manifests)["redis"]
    anywhere = Endpoint(None, ip="8.8.8.8")
    assert not allowed(policies, redis, anywhere, 53, "Egress", "UDP")
    assert not allowed(policies, redis, pods(manifests)["cache"], 50052, "Egress")


def test_dns_and_otlp_egress(case):
    manifests, values, policies = case
    # Every namespace carries kubernetes.io/metadata.name (Kubernetes >= 1.22).
    dns = Endpoint(
        "kube-system", {"k8s-app": "kube-dns"}, {"kubernetes.io/metadata.name": "kube-system"}
    )
    endpoint = values["telemetry"]["otlpEndpoint"]
    tempo = Endpoint(
        "monitoring",
        {"app.kubernetes.io/name": "tempo"},
        {"kubernetes.io/metadata.name": "monitoring"},
    )
    other = Endpoint("elsewhere", {"app": "x"}, {"kubernetes.io/metadata.name": "elsewhere"})
    for component, pod in pods(manifests).items():
        if component == "redis":
            continue
        assert allowed(policies, pod, dns, 53, "Egress", "UDP"), component
        assert allowed(policies, pod, tempo, 4317, "Egress") is bool(endpoint), component
        if values["networkPolicy"]["otlpPeers"]:
            assert not allowed(policies, pod, other, 4317, "Egress"), component


def test_kube_api_egress_only_for_api_users(case):
    manifests, values, policies = case
    api = Endpoint(None, ip=values["networkPolicy"]["kubeApi"]["cidrs"][0].split("/")[0])
    port = values["networkPolicy"]["kubeApi"]["ports"][0]
    users = {"operator"} | (
        {"gateway"} if values["gateway"]["discovery"] == "endpointslices" else set()
    )
    for component, pod in pods(manifests).items():
        assert allowed(policies, pod, api, port, "Egress") is (component in users), component


def test_external_redis_egress(render):
    manifests = render("external-redis")
    policies = list(by_kind(manifests, "NetworkPolicy").values())
    cache = pods(manifests)["cache"]
    assert allowed(policies, cache, Endpoint(None, ip="10.20.3.4"), 6380, "Egress")
    assert not allowed(policies, cache, Endpoint(None, ip="10.30.3.4"), 6380, "Egress")
    assert not allowed(policies, cache, Endpoint(None, ip="10.20.3.4"), 6379, "Egress")


def test_redis_cluster_egress(render):
    manifests = render("redis-cluster")
    policies = list(by_kind(manifests, "NetworkPolicy").values())
    cache = pods(manifests)["cache"]
    in_cache_ns = Endpoint("cache", namespace_labels={"kubernetes.io/metadata.name": "cache"})
    elsewhere = Endpoint("other", namespace_labels={"kubernetes.io/metadata.name": "other"})
    assert allowed(policies, cache, in_cache_ns, 6379, "Egress")
    assert not allowed(policies, cache, elsewhere, 6379, "Egress")
    assert not allowed(policies, cache, in_cache_ns, 6380, "Egress")


def test_ingress_sources_within_the_release(case):
    """Ingress alone (not relying on the sources' egress rules): who may open each port."""
    manifests, values, policies = case
    p = pods(manifests)
    port_map = ports(values)
    expected = {
        ("encoder", "grpc"): {"gateway"},
        ("cache", "grpc"): {"gateway", "encoder", "llm"},
        ("llm", "grpc"): {"gateway"},
        ("encoder", "metrics"): {"operator"},
        ("llm", "metrics"): {"operator"},
        ("cache", "metrics"): set(),
        ("operator", "metrics"): set(),
        ("gateway", "metrics"): set(),
        ("redis", "redis"): {"cache"},
    }
    for (target, port_name), sources in expected.items():
        if target not in p:
            continue
        port = port_map[target][port_name]
        got = {
            source
            for source, pod in p.items()
            if source != target and allowed(policies, p[target], pod, port, "Ingress")
        }
        assert got == sources & set(p), (target, port_name)
