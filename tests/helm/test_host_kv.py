"""The chart's host KV tier: llm.hostKVBytes sets the LLM pod's IRIS_LLM_HOST_KV_BYTES and,
as pinned host memory counts against the pod's cgroup, adds that many
bytes to each memory request and limit that is set, whatever unit those are written in."""

from __future__ import annotations

import pytest
import yaml

from tests.helm.chart import workloads

GI = 1 << 30


def _container(manifests) -> dict:
    return workloads(manifests)["llm"]["spec"]["template"]["spec"]["containers"][0]


def _env(container: dict) -> dict[str, str]:
    return {item["name"]: item.get("value") for item in container["env"]}


def _memory(container: dict) -> tuple[object, object]:
    resources = container["resources"]
    return resources["requests"].get("memory"), resources["limits"].get("memory")


def test_off_by_default_leaves_env_and_memory_alone(render):
    container = _container(render("default"))
    assert "IRIS_LLM_HOST_KV_BYTES" not in _env(container)
    assert _memory(container) == ("16Gi", "32Gi")


def test_bytes_set_the_env_and_grow_request_and_limit(render):
    container = _container(render("default", "--set", f"llm.hostKVBytes={64 * GI}"))
    assert _env(container)["IRIS_LLM_HOST_KV_BYTES"] == str(64 * GI)
    assert _memory(container) == ((16 + 64) * GI, (32 + 64) * GI)


def test_the_ranks_share_the_pods_tier(render):
    sets = ("--set", f"llm.hostKVBytes={8 * GI}", "--set", "llm.tensorParallelSize=4")
    container = _container(render("default", *sets))
    assert _env(container)["IRIS_LLM_HOST_KV_BYTES"] == str(8 * GI)  # the pod's, split
    assert _memory(container) == ((16 + 8) * GI, (32 + 8) * GI)


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        ("1.5Gi", 1536 << 20),
        ("512Mi", 512 << 20),
        ("100Ki", 102400),
        ("1Ti", 1 << 40),
        ("2G", 2 * 10**9),
        ("2500M", 25 * 10**8),
        ("3e9", 3 * 10**9),
        ("1.5E", 15 * 10**17),  # E alone is exa, not an exponent
        ("0.1Gi", 107374183),  # 107374182.4, rounded up as Kubernetes does
        ("128974848000m", 128974848),
        ("17179869184", 16 * GI),
    ],
)
def test_memory_in_any_unit_is_added_in_bytes(render, quantity, expected):
    sets = ("--set", f"llm.hostKVBytes={GI}", "--set-string")
    container = _container(render("default", *sets, f"llm.resources.limits.memory={quantity}"))
    assert _memory(container) == (17 * GI, expected + GI)


def test_numbers_from_a_values_file_and_from_set(render, tmp_path):
    # A values file's integers reach the template as floats, --set's as integers.
    values = tmp_path / "numbers.yaml"
    numbers = {"hostKVBytes": 96 * GI, "resources": {"limits": {"memory": 40 * GI}}}
    values.write_text(yaml.safe_dump({"llm": numbers}))
    container = _container(render("default", "-f", str(values)))
    assert _env(container)["IRIS_LLM_HOST_KV_BYTES"] == str(96 * GI)
    assert _memory(container) == (112 * GI, 136 * GI)
    sets = ("--set", f"llm.hostKVBytes={GI}", "--set", f"llm.resources.limits.memory={40 * GI}")
    assert _memory(_container(render("default", *sets))) == (17 * GI, 41 * GI)


def test_a_memory_not_set_stays_unset(render):
    sets = ("--set", f"llm.hostKVBytes={GI}", "--set", "llm.resources.requests.memory=null")
    container = _container(render("default", *sets))
    # Kubernetes then takes the request from the limit, which includes the tier.
    assert _memory(container) == (None, 33 * GI)


@pytest.mark.parametrize(
    "overrides",
    [
        ["--set", "llm.hostKVBytes=-1"],
        ["--set", "llm.hostKVBytes=64Gi"],
        ["--set", "llm.hostKVBytes=1", "--set", "llm.resources.requests.memory=lots"],
    ],
)
def test_bad_values_are_refused_by_name(render_error, overrides):
    path = overrides[-1].split("=")[0]
    assert path in render_error("default", *overrides)
