"""Service plumbing: /metrics and /healthz, gRPC health, memory-store eviction, settings."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embedding_cache_svc.client import CacheClient
from embedding_cache_svc.server import SERVICE_NAME
from embedding_cache_svc.settings import CacheSettings
from iris import metrics as names
from iris.settings import SettingsError
from tests.embedding_cache_svc.helpers import FINGERPRINT, ServerThread, make_settings, new_key


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.status, reply.read()


def test_metrics_and_health_endpoints(service):
    with CacheClient(service.address, FINGERPRINT) as client:
        key = new_key()
        client.put(key, torch.ones(1, 4), 1)
        client.get_many([(key, 1), (new_key(), 1)], 4, torch.float32)
        client.reserve([(new_key(), 1)], 1000)
    base = f"http://127.0.0.1:{service.server.metrics_port}"
    status, body = _get(f"{base}/metrics")
    text = body.decode()
    assert status == 200
    for name in (names.CACHE_HITS, names.CACHE_MISSES, names.CACHE_RESERVATIONS):
        assert f"\n{name}" in text, name
    assert f'{names.CACHE_LATENCY_SECONDS}_count{{op="put"}}' in text
    status, body = _get(f"{base}/healthz")
    assert status == 200 and b'"store_ok": true' in body
    with pytest.raises(urllib.error.HTTPError) as info:
        _get(f"{base}/nope")
    assert info.value.code == 404
    with grpc.insecure_channel(service.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_memory_store_evicts_lru_under_its_byte_budget():
    service = ServerThread(
        make_settings("memory", memory_bytes=64 * 1024, max_entry_bytes=32 * 1024)
    )
    try:
        with CacheClient(service.address, FINGERPRINT) as client:
            keys = [new_key() for _ in range(5)]
            for key in keys:
                client.put(key, torch.zeros(16, 256), 16)  # 16 KiB each
            assert client.exists(keys) == [False, True, True, True, True]
            stats = client.stats()
            assert stats["bytes"] == 64 * 1024 and stats["evictions"] == 1
        evictions = service.server.metrics.registry.get_sample_value(f"{names.CACHE_EVICTIONS}")
        assert evictions == 1
    finally:
        service.close()


def test_settings_name_the_bad_key(monkeypatch):
    monkeypatch.setenv("IRIS_CACHE_STORE", "etcd")
    with pytest.raises(SettingsError, match="IRIS_CACHE_STORE"):
        CacheSettings.load()
    monkeypatch.setenv("IRIS_CACHE_STORE", "redis")
    monkeypatch.setenv("IRIS_CACHE_MEMORY_BYTES", "0")
    with pytest.raises(SettingsError, match="IRIS_CACHE_MEMORY_BYTES"):
        CacheSettings.load()
    monkeypatch.delenv("IRIS_CACHE_MEMORY_BYTES")
    monkeypatch.setenv("IRIS_CACHE_REDIS_URL", "redis://10.0.0.1:6380/2")
    settings = CacheSettings.load()
    assert (settings.port, settings.metrics_port) == (names.CACHE_GRPC_PORT, 9102)
    assert settings.store == "redis" and settings.redis_url.endswith(":6380/2")


def test_cli_module_imports_nothing_heavy():
    code = (
        "import sys, embedding_cache_svc.cli as c; assert callable(c.command); "
        "heavy = {'torch', 'grpc', 'redis'} & set(sys.modules); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_iris_cache_command_serves_and_stops_on_sigterm(tmp_path):
    from tests.fixtures.redis_server import free_port

    port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRIS_CACHE_")}
    command = [sys.executable, "-m", "iris.cli", "cache", "--port", str(port)]
    command += ["--metrics-port", str(metrics_port), "--store", "memory"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    try:
        with CacheClient(f"127.0.0.1:{port}", FINGERPRINT) as client:
            grpc.channel_ready_future(client._channel).result(timeout=60)
            key = new_key()
            client.put(key, torch.ones(2, 2), 2)
            assert client.exists([key]) == [True]
        assert _get(f"http://127.0.0.1:{metrics_port}/healthz")[0] == 200
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()[-2000:]


def test_server_spans_join_the_callers_trace(memory_service):
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from iris.telemetry import setup_tracing

    exporter = InMemorySpanExporter()
    setup_tracing("iris-test", extra_processors=[SimpleSpanProcessor(exporter)])
    with (
        trace.get_tracer("test").start_as_current_span("caller") as caller,
        CacheClient(memory_service.address, FINGERPRINT) as client,
    ):
        client.exists([new_key()])
        client.get_many([(new_key(), 1)], 4, torch.float32)
    trace_id = caller.get_span_context().trace_id
    served = {
        span.name for span in exporter.get_finished_spans() if span.context.trace_id == trace_id
    }
    assert {"cache.exists", "cache.get"} <= served
