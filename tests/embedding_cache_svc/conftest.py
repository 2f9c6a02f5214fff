"""Fixtures of the cache tests: one shared service per store kind (tests use fresh keys)."""

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


@pytest.fixture(params=["memory", "redis"])
def service(request) -> ServerThread:
    """The shared service of each store kind (tests use fresh random keys)."""
    return request.getfixturevalue(f"{request.param}_service")
