"""`iris up`'s configuration: bad values are refused with the value named."""

from pathlib import Path

import pytest

from iris.up.platform import Platform, UpConfig


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"cache": "disk"}, "cache must be memory, redis or redis-cluster, got 'disk'"),
        (
            {"router": "fastest"},
            "router must be one of prefix, estimated-wait, estimated-ttft, round-robin, got",
        ),
        ({"llm_pods": 0}, "need at least one LLM pod"),
        ({"services": ("encoder",)}, "services must be one of"),
        ({"services": ("cache", "llm")}, "services must be one of"),
    ],
)
def test_bad_configs_are_refused(overrides, fragment):
    with pytest.raises(ValueError, match=fragment):
        UpConfig(model_dir=Path("."), **overrides)


def test_a_leading_part_of_the_platform_plans_only_that_part(tmp_path):
    platform = Platform(
        UpConfig(model_dir=tmp_path, services=("cache", "encoder"), log_dir=tmp_path)
    )
    platform.plan()
    assert [service.kind for service in platform.services] == ["cache", "encoder"]


def gateway_env(platform: Platform) -> dict[str, str]:
    (gateway,) = [service for service in platform.services if service.kind == "gateway"]
    return gateway.child.env


def test_the_gateway_is_open_by_default_and_takes_api_keys(tmp_path):
    open_platform = Platform(UpConfig(model_dir=tmp_path, log_dir=tmp_path))
    open_platform.plan()
    assert "IRIS_GATEWAY_API_KEYS" not in gateway_env(open_platform)
    keyed = Platform(UpConfig(model_dir=tmp_path, log_dir=tmp_path, api_keys=("k1", "k,2")))
    keyed.plan()
    assert gateway_env(keyed)["IRIS_GATEWAY_API_KEYS"] == '["k1", "k,2"]'


def test_n_gateways_each_get_their_own_ports_over_the_same_pods(tmp_path):
    platform = Platform(UpConfig(model_dir=tmp_path, log_dir=tmp_path, llm_pods=2, gateways=3))
    platform.plan()
    gateways = [service for service in platform.services if service.kind == "gateway"]
    assert [g.name for g in gateways] == ["gateway", "gateway-1", "gateway-2"]
    ports = {g.address for g in gateways} | {g.metrics_port for g in gateways}
    assert len(ports) == 6
    assert platform.gateway_urls == [f"http://{g.address}" for g in gateways]
    assert platform.gateway_url == platform.gateway_urls[0]
    pods = ",".join(platform.addresses("llm"))
    assert all(g.child.env["IRIS_GATEWAY_LLM_ADDRESSES"] == pods for g in gateways)


def test_zero_gateways_are_refused():
    with pytest.raises(ValueError, match="need at least one gateway, got 0"):
        UpConfig(model_dir=Path("."), gateways=0)


def test_a_plain_language_model_plans_no_encoder(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    platform = Platform(UpConfig(model_dir=tmp_path, log_dir=tmp_path))
    platform.plan()
    assert [service.kind for service in platform.services] == ["cache", "llm", "gateway"]
    env = gateway_env(platform)
    assert env.get("IRIS_GATEWAY_ENCODER_ADDRESSES", "") == ""


def llm_env(platform: Platform) -> list[dict[str, str]]:
    return [service.child.env for service in platform.services if service.kind == "llm"]


def test_the_kv_store_is_off_by_default_and_memory_gives_each_pod_its_own(tmp_path):
    plain = Platform(UpConfig(model_dir=tmp_path, log_dir=tmp_path, llm_pods=2))
    plain.plan()
    for env in llm_env(plain):
        assert not any(name.startswith("IRIS_LLM_KV_STORE") for name in env)
        assert "IRIS_LLM_HOST_KV_BYTES" not in env
    memory = Platform(UpConfig(model_dir=tmp_path, log_dir=tmp_path, llm_pods=2, kv_store="memory"))
    memory.plan()
    for env in llm_env(memory):
        assert env["IRIS_LLM_KV_STORE"] == "memory"
        assert env["IRIS_LLM_KV_STORE_URL"]  # a name inside each pod's own process
        assert env["IRIS_LLM_HOST_KV_BYTES"] == str(256 << 20)  # the store needs the tier
    assert [service.kind for service in memory.services].count("redis") == 0
    tier_only = Platform(UpConfig(model_dir=tmp_path, log_dir=tmp_path, host_kv_bytes=1 << 20))
    tier_only.plan()
    (env,) = llm_env(tier_only)
    assert env["IRIS_LLM_HOST_KV_BYTES"] == str(1 << 20) and "IRIS_LLM_KV_STORE" not in env


def test_kv_store_redis_is_its_own_bounded_server_beside_the_caches(tmp_path):
    config = UpConfig(model_dir=tmp_path, log_dir=tmp_path, llm_pods=2, cache="redis",
                      kv_store="redis", kv_store_maxmemory_mb=64)  # fmt: skip
    platform = Platform(config)
    try:
        platform.plan()  # starts both redis-servers (the pods are only planned)
        store = platform.service("kv-store")
        assert store.kind == "redis" and store.address != platform.service("redis").address
        argv = " ".join(store.child.argv)
        assert "--maxmemory 64mb" in argv and "--maxmemory-policy allkeys-lru" in argv
        assert platform.kv_store_url == f"redis://{store.address}/0"
        for env in llm_env(platform):
            assert env["IRIS_LLM_KV_STORE"] == "redis"
            assert env["IRIS_LLM_KV_STORE_URL"] == platform.kv_store_url
            assert int(env["IRIS_LLM_HOST_KV_BYTES"]) > 0
    finally:
        platform.stop()


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"kv_store": "disk"}, "kv_store must be off, memory, redis or redis-cluster"),
        ({"kv_store": "redis", "host_kv_bytes": 0}, "needs the host KV tier"),
        ({"kv_store": "memory", "tensor_parallel_size": 2}, "needs tensor_parallel_size 1"),
        ({"host_kv_bytes": -1}, "host_kv_bytes must be >= 0"),
    ],
)
def test_bad_kv_store_configs_are_refused(overrides, fragment):
    with pytest.raises(ValueError, match=fragment):
        UpConfig(model_dir=Path("."), **overrides)
