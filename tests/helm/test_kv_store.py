"""The chart's KV store the LLM pods share (kvStore): off by default; run by the chart (its
own StatefulSet, Service, Secret, maxmemory with allkeys-lru) or outside it (one node over
TLS, or a Cluster); the LLM pods get its IRIS_LLM_KV_STORE_* settings with the password from
a Secret; its NetworkPolicy lets only the LLM pods reach it; and values that cannot work
fail the render, naming the value."""

from __future__ import annotations

import pytest

from tests.helm.chart import NAMESPACE, by_kind, containers, env_of, load_values, workloads
from tests.helm.netpol import Endpoint, allowed, flow
from tests.helm.test_networkpolicy import pods

KV = "demo-iris-kv-store"
STORE_ENV = "IRIS_LLM_KV_STORE"


def llm_env(manifests) -> dict[str, dict]:
    (container,) = containers(workloads(manifests)["llm"], init=False)
    return env_of(container)


def policies(manifests) -> list[dict]:
    return list(by_kind(manifests, "NetworkPolicy").values())


def test_off_by_default(render):
    manifests = render("default")
    assert "kv-store" not in workloads(manifests)
    assert not any(m["metadata"]["name"] == KV for m in manifests)
    assert not any(name.startswith(STORE_ENV) for name in llm_env(manifests))


def test_the_charts_store_is_bounded_least_recently_used_and_saves_nothing(render):
    manifests = render("kv-store")
    values = load_values("kv-store")["kvStore"]
    store = workloads(manifests)["kv-store"]
    assert store["kind"] == "StatefulSet" and store["spec"]["replicas"] == 1
    (container,) = containers(store, init=False)
    command = " ".join(container["args"])
    assert command.startswith("exec valkey-server")  # kvStore.server: valkey
    assert f"--port {values['port']}" in command
    assert "--maxmemory 2gb" in command and "--maxmemory-policy allkeys-lru" in command
    assert "--save ''" in command and "--appendonly no" in command
    assert '--requirepass "$KV_STORE_PASSWORD"' in command  # never in the pod spec itself
    assert "valkey-cli" in " ".join(container["readinessProbe"]["exec"]["command"])
    assert container["image"] == "valkey/valkey:8.0-bookworm"
    (service,) = [m for m in by_kind(manifests, "Service").values() if m["metadata"]["name"] == KV]
    assert service["spec"]["ports"][0]["port"] == values["port"]
    secret = by_kind(manifests, "Secret")[KV]
    assert set(secret["data"]) == {"kv-pass"}
    # Apart from the embedding cache's Redis: KV pages must never evict embeddings.
    assert workloads(manifests)["redis"]["metadata"]["name"] != KV


def test_the_llm_pods_get_the_store_with_its_password_from_the_secret(render):
    env = llm_env(render("kv-store"))
    assert env[STORE_ENV]["value"] == "redis"
    assert env[f"{STORE_ENV}_URL"]["value"] == f"redis://{KV}:6390/0"
    ref = env[f"{STORE_ENV}_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": KV, "key": "kv-pass"}
    assert env[f"{STORE_ENV}_TIMEOUT_S"]["value"] == "0.25"
    assert env[f"{STORE_ENV}_WRITE_QUEUE"]["value"] == "4096"
    assert env[f"{STORE_ENV}_RETRY_S"]["value"] == "10"
    assert int(env["IRIS_LLM_HOST_KV_BYTES"]["value"]) > 0
    assert f"{STORE_ENV}_TLS" not in env


def test_only_the_llm_pods_reach_the_store_and_it_talks_to_nobody(render):
    manifests = render("kv-store")
    rules, release = policies(manifests), pods(manifests)
    store, port = release["kv-store"], 6390
    assert flow(rules, release["llm"], store, port)
    for other in ("gateway", "encoder", "cache", "operator", "redis"):
        assert not flow(rules, release[other], store, port), other
        assert not allowed(rules, store, release[other], port, "Ingress"), other
    outsider = Endpoint("elsewhere", {"app": "llm"}, {"kubernetes.io/metadata.name": "x"})
    assert not allowed(rules, store, outsider, port, "Ingress")
    # The policy selects the LLM pods by their labels only (one podSelector, same namespace).
    (policy,) = [p for p in rules if p["metadata"]["name"] == KV]
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}
    llm_labels = workloads(manifests)["llm"]["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= llm_labels.items()
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "llm"
    assert policy["spec"]["egress"] == []
    assert not allowed(rules, store, Endpoint(None, ip="8.8.8.8"), 53, "Egress", "UDP")
    assert not allowed(rules, store, Endpoint(NAMESPACE, {}), 443, "Egress")


def test_an_external_store_over_tls_reached_at_its_peers_only(render):
    manifests = render("kv-store-external")
    assert "kv-store" not in workloads(manifests)
    env = llm_env(manifests)
    assert env[f"{STORE_ENV}_URL"]["value"] == "rediss://kv.example.internal:6380/0"
    ref = env[f"{STORE_ENV}_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "kv-store-credentials", "key": "password"}
    assert env[f"{STORE_ENV}_TLS"]["value"] == "true"
    assert env[f"{STORE_ENV}_TLS_VERIFY"]["value"] == "false"
    llm, rules = pods(manifests)["llm"], policies(manifests)
    assert allowed(rules, llm, Endpoint(None, ip="10.20.3.4"), 6380, "Egress")
    assert not allowed(rules, llm, Endpoint(None, ip="10.99.3.4"), 6380, "Egress")
    assert not allowed(rules, llm, Endpoint(None, ip="10.20.3.4"), 6379, "Egress")


def test_a_cluster_store_gets_its_seeds_and_their_ports(render):
    manifests = render("kv-store-cluster")
    env = llm_env(manifests)
    assert env[STORE_ENV]["value"] == "redis-cluster"
    nodes = "kv-0.kv.example.internal:7000,kv-1.kv.example.internal:7001"
    assert env[f"{STORE_ENV}_CLUSTER_NODES"]["value"] == nodes
    assert f"{STORE_ENV}_URL" not in env
    ref = env[f"{STORE_ENV}_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "kv-cluster-credentials", "key": "cluster-password"}
    llm, rules = pods(manifests)["llm"], policies(manifests)
    anywhere = Endpoint(None, ip="10.1.2.3")  # externalKVStorePeers []: any destination
    assert allowed(rules, llm, anywhere, 7000, "Egress")
    assert allowed(rules, llm, anywhere, 7001, "Egress")
    assert not allowed(rules, llm, anywhere, 7002, "Egress")


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["kvStore.enabled=true"], "kvStore.enabled needs llm.hostKVBytes > 0"),
        (
            ["kvStore.enabled=true", "llm.hostKVBytes=1024", "llm.tensorParallelSize=2"],
            "kvStore.enabled needs llm.tensorParallelSize 1 (got 2)",
        ),
        (
            ["kvStore.enabled=true", "llm.hostKVBytes=1024", "kvStore.deploy=false"],
            "kvStore.external.url is required when kvStore.mode is redis",
        ),
        (
            ["kvStore.enabled=true", "llm.hostKVBytes=1024", "kvStore.mode=redis-cluster"],
            "kvStore.cluster.nodes (host:port seeds of an existing cluster) is required",
        ),
        (
            [
                "kvStore.enabled=true",
                "llm.hostKVBytes=1024",
                "kvStore.auth.existingSecret=s",
                "kvStore.auth.password=p",
            ],
            "kvStore.auth: set existingSecret or password, not both",
        ),  # fmt: skip
        (["kvStore.mode=memory"], "kvStore.mode"),  # schema: not shared between pods
        (["kvStore.maxmemoryPolicy=lru"], "kvStore.maxmemoryPolicy"),
        (["kvStore.writeQueue=0"], "kvStore.writeQueue"),
    ],
)
def test_values_that_cannot_work_fail_naming_them(render_error, sets, message):
    args = [arg for item in sets for arg in ("--set", item)]
    assert message in render_error("default", *args)
