"""Redis clients from settings: one node (`redis.asyncio.Redis`) or a Redis Cluster
(`redis.asyncio.cluster.RedisCluster`, which follows MOVED / ASK redirects and refreshes
its slot map itself). Both get the password, TLS and timeouts of the settings; neither
retries for long, so an unreachable node surfaces within about the connect timeout."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from embedding_cache_svc.settings import CacheSettings


def _tls_url(url: str, tls: bool) -> str:
    parts = urlsplit(url)
    if tls and parts.scheme == "redis":
        return urlunsplit(parts._replace(scheme="rediss"))
    return url


def display_url(url: str) -> str:
    """host:port of a Redis URL, for messages (never the password)."""
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"


def _common_options(settings: CacheSettings) -> dict:
    options: dict = {
        "socket_connect_timeout": settings.redis_connect_timeout_s,
        "socket_timeout": settings.redis_op_timeout_s,
        "retry": Retry(NoBackoff(), 1),
        "max_connections": settings.redis_max_connections,
    }
    if settings.redis_password:
        options["password"] = settings.redis_password
    return options


def _tls_options(settings: CacheSettings) -> dict:
    options: dict = {"ssl_cert_reqs": "required" if settings.redis_tls_verify else "none"}
    if settings.redis_tls_ca_file:
        options["ssl_ca_certs"] = settings.redis_tls_ca_file
    if settings.redis_tls_cert_file:
        options["ssl_certfile"] = settings.redis_tls_cert_file
    if settings.redis_tls_key_file:
        options["ssl_keyfile"] = settings.redis_tls_key_file
    return options


def connect(settings: CacheSettings) -> aioredis.Redis:
    """A pooled single-node client (password and TLS included)."""
    url = _tls_url(settings.redis_url, settings.redis_tls)
    options = _common_options(settings)
    if url.startswith("rediss://"):
        options |= _tls_options(settings)
    return aioredis.Redis.from_url(url, **options)


def seed_nodes(addresses: list[str]) -> list[ClusterNode]:
    """ClusterNodes of checked ``host:port`` seeds (the settings validated them)."""
    nodes = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    return nodes


def connect_cluster(settings: CacheSettings) -> RedisCluster:
    """A cluster client seeded from `redis_cluster_nodes`; it connects on first use, so a
    cluster that cannot be reached yet makes the service not-ready, not fail to start."""
    options = _common_options(settings)
    if settings.redis_tls:
        options["ssl"] = True
        options |= _tls_options(settings)
    # The one retry of `retry` comes after a topology refresh: a failover shows as
    # UNAVAILABLE for that shard's items at once instead of stalling through many retries.
    return RedisCluster(startup_nodes=seed_nodes(settings.redis_cluster_nodes), **options)
