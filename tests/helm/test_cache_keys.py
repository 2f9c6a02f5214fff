"""Cache keys know the release and the weights (issue 34, item 6): the chart prefixes the
Redis keys with the release name, and hands `model.revision` to every service that computes
the fingerprint (gateway, encoder, LLM pods)."""

from __future__ import annotations

from tests.helm.chart import RELEASE, containers, env_of, workloads


def _env(manifests, component: str) -> dict[str, dict]:
    (container, *_) = containers(workloads(manifests)[component], init=False)
    return env_of(container)


def test_redis_keys_are_prefixed_with_the_release_name(render):
    env = _env(render(), "cache")
    assert env["IRIS_CACHE_REDIS_KEY_PREFIX"]["value"] == f"iris:{RELEASE}:"


def test_model_revision_reaches_every_fingerprinting_service(render):
    manifests = render("default", "--set", "model.revision=0123abcd")
    for component, prefix in (("gateway", "GATEWAY"), ("encoder", "ENCODER"), ("llm", "LLM")):
        env = _env(manifests, component)
        assert env[f"IRIS_{prefix}_MODEL_REVISION"]["value"] == "0123abcd", component
