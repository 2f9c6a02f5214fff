"""Pod and container security, resources, probes and scratch mounts on the rendered objects."""

from __future__ import annotations

import pytest

from tests.helm.chart import SCENARIOS, by_kind, containers, env_of, load_values, workloads

IRIS = ("gateway", "encoder", "cache", "llm", "operator")


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def volumes(workload: dict) -> dict[str, dict]:
    return {volume["name"]: volume for volume in pod_spec(workload).get("volumes", [])}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pods_run_as_non_root_with_runtime_default_seccomp(render, scenario):
    for component, workload in workloads(render(scenario)).items():
        context = pod_spec(workload)["securityContext"]
        assert context["runAsNonRoot"] is True, component
        assert context["runAsUser"] > 0, component
        assert context["seccompProfile"]["type"] == "RuntimeDefault", component


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_containers_are_locked_down(render, scenario):
    for component, workload in workloads(render(scenario)).items():
        for container in containers(workload):
            where = f"{component}/{container['name']}"
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert "add" not in context["capabilities"], where
            assert context.get("privileged", False) is False, where


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_resources_and_probes(render, scenario):
    for component, workload in workloads(render(scenario)).items():
        for container in containers(workload):
            where = f"{component}/{container['name']}"
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), where
            assert "memory" in resources["limits"], where
        for container in containers(workload, init=False):
            assert "livenessProbe" in container and "readinessProbe" in container, component


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_writable_paths_are_emptydirs(render, scenario):
    """With a read-only root, everything the code writes must land on an emptyDir mount."""
    for component, workload in workloads(render(scenario)).items():
        if component not in IRIS:
            continue
        vols = volumes(workload)
        (container,) = containers(workload, init=False)
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        writable = [
            path
            for path, m in mounts.items()
            if not m.get("readOnly") and "emptyDir" in vols[m["name"]]
        ]
        env = env_of(container)
        for name in ("HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME"):
            path = env[name]["value"]
            assert any(path == w or path.startswith(w + "/") for w in writable), (component, name)
        assert "/tmp" in writable, component


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_model_is_mounted_read_only_where_needed(render, scenario):
    values = load_values(scenario)
    for component, workload in workloads(render(scenario)).items():
        vols = volumes(workload)
        (container,) = containers(workload, init=False)
        mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
        if component not in ("gateway", "encoder", "llm"):
            assert "model" not in vols, component
            continue
        assert mounts["model"]["readOnly"] is True, component
        assert mounts["model"]["mountPath"] == values["model"]["mountPath"]
        source = values["model"]["source"]
        init = pod_spec(workload).get("initContainers", [])
        if source == "image":
            assert "emptyDir" in vols["model"]
            (copy,) = init
            assert copy["image"].startswith(values["model"]["image"]["repository"] + ":")
            assert copy["volumeMounts"] == [{"name": "model", "mountPath": "/models"}]
        else:
            assert not init, component
            expected = {"pvc": "persistentVolumeClaim", "hostPath": "hostPath"}[source]
            assert expected in vols["model"], component


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gpu_pods(render, scenario):
    values = load_values(scenario)
    for component, workload in workloads(render(scenario)).items():
        (container,) = containers(workload, init=False)
        resources = container["resources"]
        if component in ("encoder", "llm"):
            gpus = values[component]["gpus"]
            if component == "llm":  # one set of GPUs per tensor-parallel rank
                gpus *= values["llm"].get("tensorParallelSize", 1)
            assert resources["limits"]["nvidia.com/gpu"] == gpus
            assert pod_spec(workload)["nodeSelector"] == values[component]["nodeSelector"]
            assert pod_spec(workload)["tolerations"] == values[component]["tolerations"]
            assert not container["image"].endswith(values["image"]["cpuTagSuffix"])
        else:
            assert "nvidia.com/gpu" not in resources.get("limits", {}), component
            if component in IRIS:
                assert container["image"].endswith(values["image"]["cpuTagSuffix"]) or (
                    values[component]["image"].get("tag")
                ), component


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_autoscaled_deployments_leave_replicas_to_the_operator(render, scenario):
    autoscaled = load_values(scenario)["autoscaler"]["enabled"]
    deployments = workloads(render(scenario))
    for component in ("encoder", "llm"):
        assert ("replicas" in deployments[component]["spec"]) is not autoscaled, component
    assert "replicas" in deployments["gateway"]["spec"]
    assert "replicas" in deployments["cache"]["spec"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_api_tokens_only_where_the_api_is_used(render, scenario):
    values = load_values(scenario)
    for component, workload in workloads(render(scenario)).items():
        mounted = pod_spec(workload).get("automountServiceAccountToken")
        if component == "operator":
            assert mounted is True
        elif component == "gateway":
            assert mounted is (values["gateway"]["discovery"] == "endpointslices")
        else:
            assert mounted is False, component


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_secrets_never_appear_in_pod_specs(render, scenario):
    """Passwords and API keys reach containers through secretKeyRef only."""
    values = load_values(scenario)
    secrets = [values["redis"]["auth"]["password"], *values["gateway"]["apiKeys"]["keys"]]
    secrets = [s for s in secrets if s]
    for component, workload in workloads(render(scenario)).items():
        text = repr(workload)
        for secret in secrets:
            assert secret not in text, component
        for container in containers(workload):
            for name, entry in env_of(container).items():
                if "PASSWORD" in name or "API_KEYS" in name or "AUTH" in name:
                    assert "secretKeyRef" in entry.get("valueFrom", {}), (component, name)


def test_generated_redis_password_is_random_and_strong(render):
    (secret,) = [s for name, s in by_kind(render(), "Secret").items() if name.endswith("-redis")]
    import base64

    password = base64.b64decode(secret["data"]["redis-password"]).decode()
    assert len(password) >= 32 and password.isalnum()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gateway_has_a_memory_backed_dev_shm(render, scenario):
    """Large request bodies cross to the gateway's parse workers through /dev/shm
    (docs/design/door.md); the runtime's default 64 MB would push concurrent 16 MB bodies to
    the piped path."""
    workload = workloads(render(scenario))["gateway"]
    (container,) = containers(workload, init=False)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    shm = volumes(workload)[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory"
    assert shm["sizeLimit"] == load_values(scenario)["gateway"]["shmSizeLimit"]
