"""`iris llm` / `python -m llm_svc`: settings from flags and env, a real process that
serves, and a light import (no torch until the command runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from typer.testing import CliRunner

from iris.metrics import LLM_GRPC_PORT, LLM_METRICS_PORT
from iris.settings import SettingsError
from llm_svc.proto import llm_pb2, llm_pb2_grpc
from llm_svc.server.builder import engine_config
from llm_svc.settings import LLMSettings
from tests.llm_svc.server.pods import dead_address


def test_settings_defaults_and_pod_name_sources(monkeypatch):
    for name in list(os.environ):
        if name.startswith("IRIS_LLM_") or name == "POD_NAME":
            monkeypatch.delenv(name)
    settings = LLMSettings.load()
    assert (settings.port, settings.metrics_port) == (LLM_GRPC_PORT, LLM_METRICS_PORT)
    monkeypatch.setenv("POD_NAME", "from-downward-api")
    assert LLMSettings.load().pod_name == "from-downward-api"
    monkeypatch.setenv("IRIS_LLM_POD_NAME", "from-iris-up")
    assert LLMSettings.load().pod_name == "from-iris-up"
    assert LLMSettings.load(pod_name="from-flag").pod_name == "from-flag"
    monkeypatch.setenv("IRIS_LLM_MAX_WAITING", "0")
    with pytest.raises(SettingsError, match="IRIS_LLM_MAX_WAITING"):
        LLMSettings.load()


def test_host_kv_bytes_reaches_the_engine_config(monkeypatch, tiny_idefics3_dir):
    for name in list(os.environ):
        if name.startswith("IRIS_LLM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("IRIS_LLM_MODEL", str(tiny_idefics3_dir))
    monkeypatch.setenv("IRIS_LLM_DEVICE", "cpu")
    assert engine_config(LLMSettings.load()).host_kv_bytes == 0  # off unless set
    monkeypatch.setenv("IRIS_LLM_HOST_KV_BYTES", str(48 << 30))
    assert engine_config(LLMSettings.load()).host_kv_bytes == 48 << 30
    monkeypatch.setenv("IRIS_LLM_HOST_KV_BYTES", "-1")
    with pytest.raises(SettingsError, match="IRIS_LLM_HOST_KV_BYTES"):
        LLMSettings.load()


def test_kv_store_settings_reach_the_engine_config(monkeypatch, tiny_idefics3_dir):
    for name in list(os.environ):
        if name.startswith("IRIS_LLM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("IRIS_LLM_MODEL", str(tiny_idefics3_dir))
    monkeypatch.setenv("IRIS_LLM_DEVICE", "cpu")
    assert engine_config(LLMSettings.load()).kv_store is None  # off unless set
    monkeypatch.setenv("IRIS_LLM_HOST_KV_BYTES", str(64 << 20))
    monkeypatch.setenv("IRIS_LLM_KV_STORE", "redis-cluster")
    monkeypatch.setenv("IRIS_LLM_KV_STORE_CLUSTER_NODES", "10.0.0.1:7000, 10.0.0.2:7001")
    monkeypatch.setenv("IRIS_LLM_KV_STORE_PASSWORD", "s3cret")
    monkeypatch.setenv("IRIS_LLM_KV_STORE_TLS", "true")
    monkeypatch.setenv("IRIS_LLM_KV_STORE_TLS_VERIFY", "false")
    monkeypatch.setenv("IRIS_LLM_KV_STORE_TLS_CA_FILE", "/etc/kv/ca.pem")
    monkeypatch.setenv("IRIS_LLM_KV_STORE_TIMEOUT_S", "0.25")
    monkeypatch.setenv("IRIS_LLM_KV_STORE_WRITE_QUEUE", "64")
    monkeypatch.setenv("IRIS_LLM_KV_STORE_RETRY_S", "2")
    store = engine_config(LLMSettings.load()).kv_store
    assert store is not None and store.kind == "redis-cluster"
    assert store.cluster_nodes == ("10.0.0.1:7000", "10.0.0.2:7001")
    assert (store.password, store.tls, store.tls_verify) == ("s3cret", True, False)
    assert store.tls_ca_file == "/etc/kv/ca.pem" and store.tls_cert_file is None
    assert (store.timeout_s, store.write_queue, store.retry_s) == (0.25, 64, 2.0)
    monkeypatch.setenv("IRIS_LLM_KV_STORE_CLUSTER_NODES", '["[::1]:7000"]')  # JSON list
    assert engine_config(LLMSettings.load()).kv_store.cluster_nodes == ("[::1]:7000",)
    monkeypatch.setenv("IRIS_LLM_KV_STORE", "memory")
    monkeypatch.setenv("IRIS_LLM_KV_STORE_URL", "shared-by-this-process")
    store = engine_config(LLMSettings.load()).kv_store
    assert (store.kind, store.url) == ("memory", "shared-by-this-process")


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"IRIS_LLM_KV_STORE": "disk"}, "IRIS_LLM_KV_STORE"),
        ({"IRIS_LLM_KV_STORE": "redis"}, "IRIS_LLM_KV_STORE_URL"),
        ({"IRIS_LLM_KV_STORE": "redis-cluster"}, "IRIS_LLM_KV_STORE_CLUSTER_NODES"),
        ({"IRIS_LLM_KV_STORE": "memory", "IRIS_LLM_HOST_KV_BYTES": "0"}, "IRIS_LLM_HOST_KV_BYTES"),
        ({"IRIS_LLM_KV_STORE_TIMEOUT_S": "0"}, "IRIS_LLM_KV_STORE_TIMEOUT_S"),
        ({"IRIS_LLM_KV_STORE_WRITE_QUEUE": "0"}, "IRIS_LLM_KV_STORE_WRITE_QUEUE"),
        ({"IRIS_LLM_KV_STORE_RETRY_S": "-1"}, "IRIS_LLM_KV_STORE_RETRY_S"),
        ({"IRIS_LLM_KV_STORE_CLUSTER_NODES": "nohost"}, "IRIS_LLM_KV_STORE_CLUSTER_NODES"),
    ],
)
def test_a_bad_kv_store_setting_is_refused_naming_it(monkeypatch, env, named):
    for name in list(os.environ):
        if name.startswith("IRIS_LLM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("IRIS_LLM_HOST_KV_BYTES", str(64 << 20))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=named):
        LLMSettings.load()


def test_the_cli_module_imports_no_torch():
    code = "import sys, llm_svc.cli; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_iris_llm_is_a_subcommand():
    from iris.cli import app

    result = CliRunner().invoke(app, ["llm", "--help"])
    assert result.exit_code == 0
    for flag in ("--model", "--port", "--metrics-port", "--page-size", "--cache-address"):
        assert flag in result.output


def _free_port() -> int:
    return int(dead_address().rsplit(":", 1)[1])


def test_python_m_llm_svc_serves_until_sigterm(tiny_idefics3_dir):
    port, metrics_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "IRIS_LLM_DEVICE": "cpu",
        "IRIS_LLM_KV_NUM_PAGES": "64",
        "IRIS_LLM_PAGE_SIZE": "8",
        "IRIS_LLM_POD_NAME": "cli-pod",
        "IRIS_LLM_SHUTDOWN_GRACE_S": "0.5",
    }
    argv = [
        sys.executable, "-m", "llm_svc", "--model", str(tiny_idefics3_dir),
        "--port", str(port), "--metrics-port", str(metrics_port), "--host", "127.0.0.1",
    ]  # fmt: skip
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240  # generous: the outcome must not hang on load
        while True:
            assert process.poll() is None, process.stdout.read().decode()
            try:
                if httpx.get(f"http://127.0.0.1:{metrics_port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the pod never became healthy"
            time.sleep(0.2)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            info = llm_pb2_grpc.LLMStub(channel).GetModelInfo(llm_pb2.ModelInfoRequest())
            assert (info.pod_name, info.page_size) == ("cli-pod", 8)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
