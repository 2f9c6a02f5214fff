"""Every IRIS_* variable the chart sets is a field of that service's Settings, and the
Settings class loads from the rendered environment (secret values stand in as fixtures).
pydantic-settings ignores unknown variables, so a misspelt name would otherwise pass silently."""

from __future__ import annotations

import importlib
import os

import pytest

from tests.helm.chart import SCENARIOS, containers, env_of, workloads

SETTINGS = {
    "gateway": ("gateway.settings", "GatewaySettings", "IRIS_GATEWAY_"),
    "encoder": ("encoder_svc.settings", "EncoderSettings", "IRIS_ENCODER_"),
    "cache": ("embedding_cache_svc.settings", "CacheSettings", "IRIS_CACHE_"),
    "llm": ("llm_svc.settings", "LLMSettings", "IRIS_LLM_"),
    "operator": ("operators.settings", "OperatorSettings", "IRIS_OPERATOR_"),
}
# What a Secret would hold, per env name.
SECRET_VALUES = {
    "IRIS_GATEWAY_API_KEYS": '["key-one"]',
    "IRIS_CACHE_REDIS_PASSWORD": "password",
    "IRIS_LLM_KV_STORE_PASSWORD": "kv-password",
}


def settings_class(component: str):
    module_name, class_name, _ = SETTINGS[component]
    return getattr(importlib.import_module(module_name), class_name)


def rendered_env(container: dict) -> dict[str, str]:
    env = {}
    for name, entry in env_of(container).items():
        if "value" in entry:
            env[name] = entry["value"]
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            env[name] = SECRET_VALUES[name]
        else:
            env[name] = "from-the-downward-api"
    return env


@pytest.mark.parametrize("component", sorted(SETTINGS))
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_env_names_are_settings_fields(render, monkeypatch, scenario, component):
    deployment = workloads(render(scenario)).get(component)
    if deployment is None:
        pytest.skip(f"{component} is not part of the {scenario} release")
    cls = settings_class(component)
    prefix = SETTINGS[component][2]
    (container,) = containers(deployment, init=False)
    env = rendered_env(container)
    fields = {f"{prefix}{name.upper()}" for name in cls.model_fields}
    unknown = {name for name in env if name.startswith(prefix)} - fields
    assert not unknown, f"{component}: {sorted(unknown)} are not fields of {cls.__name__}"

    for name in list(os.environ):
        if name.startswith("IRIS_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = cls.load()
    assert settings.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    if "port" in cls.model_fields:
        assert settings.port == ports.get("grpc", ports.get("http"))
    assert settings.metrics_port == ports.get("metrics", ports.get("http"))
