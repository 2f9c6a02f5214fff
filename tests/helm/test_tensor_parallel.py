"""The chart's tensor parallelism: llm.tensorParallelSize sets the LLM pod's GPU count
(gpus per rank x ranks) and its IRIS_LLM_TENSOR_PARALLEL_SIZE; the pod mounts a
memory-backed /dev/shm; the schema refuses sizes below 1."""

from __future__ import annotations

import pytest

from tests.helm.chart import workloads


def _llm_pod(manifests) -> dict:
    return workloads(manifests)["llm"]["spec"]["template"]["spec"]


def _env(container: dict) -> dict[str, str]:
    return {item["name"]: item.get("value") for item in container["env"]}


@pytest.mark.parametrize(("size", "gpus"), [("1", 1), ("4", 4)])
def test_size_sets_gpus_and_env(render, size, gpus):
    pod = _llm_pod(render("default", "--set", f"llm.tensorParallelSize={size}"))
    container = pod["containers"][0]
    assert _env(container)["IRIS_LLM_TENSOR_PARALLEL_SIZE"] == size
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == gpus
    assert resources["requests"]["nvidia.com/gpu"] == gpus


def test_gpus_count_per_rank(render):
    manifests = render("default", "--set", "llm.tensorParallelSize=2", "--set", "llm.gpus=2")
    assert _llm_pod(manifests)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4


def test_pod_mounts_a_memory_backed_dev_shm(render):
    pod = _llm_pod(render("default", "--set", "llm.shmSizeLimit=2Gi"))
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["shm"] == "/dev/shm"


@pytest.mark.parametrize(
    "overrides",
    [["--set", "llm.tensorParallelSize=0"], ["--set", "llm.shmSizeLimit=lots"]],
)
def test_schema_refuses_bad_values(render_error, overrides):
    assert overrides[1].split("=")[0] in render_error("default", *overrides)
