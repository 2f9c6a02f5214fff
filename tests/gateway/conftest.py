"""Fixtures of the gateway tests: the tiny model's adapter (built once), a real cache
process, and a scripted LLM pod and encoder (real gRPC) beside it."""

from __future__ import annotations

import pytest

from tests.fixtures.platform import start_cache
from tests.gateway.fake_services import PodScript, serve_encoder, serve_pod


@pytest.fixture(scope="session")
def qwen_adapter(tiny_qwen2_vl_dir):
    from iris.models import load_adapter

    return load_adapter(tiny_qwen2_vl_dir)


@pytest.fixture(scope="session")
def cache_process(tmp_path_factory):
    """A real `iris cache` process (memory store) for the session."""
    cache = start_cache(tmp_path_factory.mktemp("cache"))
    yield cache
    cache.stop()


@pytest.fixture(scope="session")
def qwen_gateway_parts(tiny_qwen2_vl_dir, qwen_adapter, cache_process):
    pod_server, pod_address, pod = serve_pod(PodScript(qwen_adapter.fingerprint))
    encoder_server, encoder_address, encoder = serve_encoder()
    yield {
        "model_dir": tiny_qwen2_vl_dir,
        "adapter": qwen_adapter,
        "pod_address": pod_address,
        "pod": pod,
        "encoder_address": encoder_address,
        "encoder": encoder,
        "cache_address": cache_process.cache_address,
    }
    pod_server.stop(0)
    encoder_server.stop(0)


@pytest.fixture(scope="session")
def hostile(qwen_gateway_parts, tmp_path_factory):
    """One real gateway process with small door limits, for every hostile-input module."""
    from tests.gateway.hostile_door import start_hostile

    running = start_hostile(qwen_gateway_parts, tmp_path_factory.mktemp("hostile") / "gw.log")
    yield running
    running.child.stop()
