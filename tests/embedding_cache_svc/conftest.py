"""Fixtures of the cache tests: one shared service per store kind (tests use fresh keys).

`service` runs each test on the memory store, one Redis node and a real Redis Cluster
(3 masters + 3 replicas); `shared_service` on the two Redis kinds only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.embedding_cache_svc.helpers import ServerThread, make_settings


@pytest.fixture(scope="session")
def memory_service() -> Iterator[ServerThread]:
    service = ServerThread(make_settings("memory", memory_bytes=256 << 20))
    yield service
    service.close()


@pytest.fixture(scope="session")
def redis_service(redis_server: str) -> Iterator[ServerThread]:
    service = ServerThread(make_settings("redis", redis_server))
    yield service
    service.close()


@pytest.fixture(scope="session")
def cluster_service(redis_cluster) -> Iterator[ServerThread]:
    service = ServerThread(make_settings("redis-cluster", ",".join(redis_cluster.addresses)))
    yield service
    service.close()


@pytest.fixture(params=["memory", "redis", "cluster"])
def service(request) -> ServerThread:
    """The shared service of each store kind (tests use fresh random keys)."""
    return request.getfixturevalue(f"{request.param}_service")


@pytest.fixture(params=["redis", "cluster"])
def shared_service(request) -> ServerThread:
    """The shared service of each Redis kind."""
    return request.getfixturevalue(f"{request.param}_service")
