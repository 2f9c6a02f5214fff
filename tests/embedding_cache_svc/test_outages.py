"""Redis restarted mid-test: the service stays up, answers UNAVAILABLE (not a timeout)
while Redis is down, and recovers; a service that is down is UNAVAILABLE too."""

from __future__ import annotations

import time
import urllib.request

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embedding_cache_svc.client import CacheClient, CacheTimeout, CacheUnavailable, Status
from tests.embedding_cache_svc.helpers import FINGERPRINT, ServerThread, make_settings, new_key
from tests.fixtures.redis_server import free_port

# Far above how long an UNAVAILABLE answer takes: reaching it would be CacheTimeout.
CALL_TIMEOUT_S = 8.0


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def _eventually(check, attempts: int = 300, pause_s: float = 0.02):
    for _ in range(attempts):
        result = check()
        if result:
            return result
        time.sleep(pause_s)
    raise AssertionError("condition never became true")


@pytest.fixture
def restartable(fresh_redis):
    service = ServerThread(make_settings("redis", fresh_redis.url, redis_op_timeout_s=2.0))
    yield service, fresh_redis
    service.close()


def test_redis_restart_mid_test(restartable):
    service, redis = restartable
    key = new_key()
    with CacheClient(service.address, FINGERPRINT, timeout_s=CALL_TIMEOUT_S) as client:
        client.put(key, torch.ones(4, 8), 4)
        assert client.exists([key]) == [True]

        redis.stop()
        for call in (
            lambda: client.get_many([(key, 4)], 8, torch.float32),
            lambda: client.put(new_key(), torch.ones(4, 8), 4),
            lambda: client.reserve([(key, 4)], 1000),
            lambda: client.wait([(key, 4)], 1.0),
            lambda: client.exists([key]),
        ):
            with pytest.raises(CacheUnavailable) as info:
                call()
            assert not isinstance(info.value, CacheTimeout)
            assert info.value.code == grpc.StatusCode.UNAVAILABLE
        # The process is alive: gRPC health turns NOT_SERVING, /healthz still answers.
        _eventually(lambda: _health(service.address) == health_pb2.HealthCheckResponse.NOT_SERVING)
        url = f"http://127.0.0.1:{service.server.metrics_port}/healthz"
        with urllib.request.urlopen(url, timeout=5) as reply:
            assert b'"store_ok": false' in reply.read()

        redis.start()  # comes back empty (no persistence)
        _eventually(lambda: _health(service.address) == health_pb2.HealthCheckResponse.SERVING)
        assert client.reserve([(key, 4)], 5000) == [Status.RESERVED]
        client.put(key, torch.full((4, 8), 2.0), 4)
        assert torch.equal(
            client.get_many([(key, 4)], 8, torch.float32)[key], torch.full((4, 8), 2.0)
        )
    errors = service.server.metrics.registry.get_sample_value(
        "iris_cache_store_errors_total", {"store": "redis"}
    )
    assert errors and errors >= 5


def test_service_down_is_unavailable():
    with CacheClient(f"127.0.0.1:{free_port()}", FINGERPRINT, timeout_s=CALL_TIMEOUT_S) as client:
        with pytest.raises(CacheUnavailable) as info:
            client.reserve([(new_key(), 1)], 1000)
        assert not isinstance(info.value, CacheTimeout)
