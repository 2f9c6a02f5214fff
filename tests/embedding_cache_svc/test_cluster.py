"""The redis-cluster store on a real Redis Cluster (3 masters + 3 replicas on loopback):
keys spread over the masters, a batch split by node, a master killed under load, a
cluster in the fail state, seeds that do not parse or cannot be reached.

Nothing here waits for a guessed time: failover is awaited by polling the cluster's own
state and the service's answers, with deadlines far above what it takes."""

from __future__ import annotations

import logging
import threading
import time

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis.cluster import key_slot

from embedding_cache_svc.client import CacheClient, CacheUnavailable, Status
from embedding_cache_svc.settings import CacheSettings
from iris.settings import SettingsError
from tests.embedding_cache_svc.helpers import (
    FINGERPRINT,
    ServerThread,
    entry_name,
    make_settings,
    new_key,
)
from tests.fixtures.redis_server import free_port

HIDDEN = 64
DEADLINE_S = 120.0  # far above a failover with node timeout 0.5 s, even on a loaded machine
CALL_TIMEOUT_S = 30.0  # far above how long an UNAVAILABLE answer takes


def _tensor(seed: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(seed))


def _poll(check, what: str, deadline_s: float = DEADLINE_S):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {deadline_s} s")


def _slot(settings: CacheSettings, key: bytes) -> int:
    return key_slot(entry_name(settings, FINGERPRINT + key))


def test_entries_spread_over_every_master(cluster_service, redis_cluster):
    settings = cluster_service.server.settings
    keys = [new_key() for _ in range(30)]
    with CacheClient(cluster_service.address, FINGERPRINT) as client:
        for seed, key in enumerate(keys):
            client.put(key, _tensor(seed, 2), 2)
        assert client.exists(keys) == [True] * len(keys)
    owners = {redis_cluster.master_of_slot(_slot(settings, key)).address for key in keys}
    assert owners == {node.address for node in redis_cluster.masters()}
    # Each entry is really on the master that owns its slot (asked there, not routed).
    for key in keys:
        node = redis_cluster.master_of_slot(_slot(settings, key))
        assert redis_cluster.exists_on(node, entry_name(settings, FINGERPRINT + key))


def test_entry_and_lease_share_a_slot_even_for_brace_bytes(cluster_service):
    store, settings = cluster_service.store, cluster_service.server.settings
    key = FINGERPRINT + b"{" + new_key(30) + b"}"  # raw braces would split the hash tag
    assert key_slot(store._entry(key)) == key_slot(store._lease(key))
    assert entry_name(settings, key) == store._entry(key)
    with CacheClient(cluster_service.address, FINGERPRINT) as client:
        item = key[len(FINGERPRINT) :]
        assert client.reserve([(item, 2)], 5000) == [Status.RESERVED]
        client.put(item, _tensor(1, 2), 2)
        assert client.reserve([(item, 2)], 5000) == [Status.PRESENT]


def test_a_batch_over_all_masters_is_answered_in_order(cluster_service):
    keys = [new_key() for _ in range(24)]
    with CacheClient(cluster_service.address, FINGERPRINT) as client:
        stored = keys[::2]
        for seed, key in enumerate(stored):
            client.put(key, _tensor(seed, 3), 3)
        states = client.reserve([(key, 3) for key in keys], 5000)
        assert states == [Status.PRESENT, Status.RESERVED] * (len(keys) // 2)
        got = client.get_many([(key, 3) for key in keys], HIDDEN, torch.float32)
        for seed, key in enumerate(stored):
            assert torch.equal(got[key], _tensor(seed, 3))
        assert all(got[key] is None for key in keys[1::2])


def test_unparseable_seeds_refuse_to_start_naming_the_setting():
    for seeds in ("nonsense", "10.0.0.1:notaport", "host:70000"):
        with pytest.raises(SettingsError, match="redis_cluster_nodes"):
            make_settings("redis-cluster", seeds)
    with pytest.raises(SettingsError, match="IRIS_CACHE_REDIS_CLUSTER_NODES"):
        make_settings("redis-cluster")


def test_no_reachable_node_starts_not_ready_with_the_reason():
    seeds = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    service = ServerThread(make_settings("redis-cluster", seeds, redis_connect_timeout_s=0.2))
    try:
        assert not service.server.store_ok
        assert "no node answers" in service.server.store_error
        with grpc.insecure_channel(service.address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=CALL_TIMEOUT_S
            )
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        client = CacheClient(service.address, FINGERPRINT, timeout_s=CALL_TIMEOUT_S)
        with client, pytest.raises(CacheUnavailable):
            client.get_many([(new_key(), 2)], HIDDEN, torch.float32)
    finally:
        service.close()


@pytest.fixture
def killable(fresh_redis_cluster):
    settings = make_settings(
        "redis-cluster",
        ",".join(fresh_redis_cluster.addresses),
        redis_connect_timeout_s=0.5,
        redis_op_timeout_s=2.0,
    )
    service = ServerThread(settings)
    yield service, fresh_redis_cluster
    service.close()


def _keys_on(settings, cluster, node, count: int, elsewhere: bool = False) -> list[bytes]:
    """Fresh keys whose master is `node` (elsewhere: is not `node`)."""
    keys: list[bytes] = []
    while len(keys) < count:
        key = new_key()
        if (cluster.master_of_slot(_slot(settings, key)).address == node.address) != elsewhere:
            keys.append(key)
    return keys


class _Load:
    """Steady Get / Put traffic from a thread; records every outcome, checks every value."""

    def __init__(self, address: str, written: dict[bytes, int]) -> None:
        self.written = written
        self.errors: list[Exception] = []
        self.wrong: list[bytes] = []
        self.ok = 0
        self._stop = threading.Event()
        self._client = CacheClient(address, FINGERPRINT, timeout_s=CALL_TIMEOUT_S)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        keys = list(self.written)
        step = 0
        while not self._stop.is_set():
            key = keys[step % len(keys)]
            step += 1
            try:
                if step % 4 == 0:
                    self._client.put(new_key(), _tensor(step, 2), 2)
                else:
                    got = self._client.get_many([(key, 4)], HIDDEN, torch.float32)[key]
                    if got is not None and not torch.equal(got, _tensor(self.written[key], 4)):
                        self.wrong.append(key)
                self.ok += 1
            except CacheUnavailable:
                pass
            except Exception as err:  # anything but a clean UNAVAILABLE is a finding
                self.errors.append(err)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(CALL_TIMEOUT_S * 2)
        self._client.close()


def test_master_killed_under_load_fails_over_cleanly(killable, caplog):
    caplog.set_level(logging.WARNING, logger="embedding_cache_svc")
    service, cluster = killable
    settings = service.server.settings
    victim = cluster.masters()[0]
    victim_keys = _keys_on(settings, cluster, victim, 6)
    other_keys = _keys_on(settings, cluster, victim, 6, elsewhere=True)
    written = {key: seed for seed, key in enumerate(victim_keys + other_keys)}
    pending = _keys_on(settings, cluster, victim, 1)[0]
    with CacheClient(service.address, FINGERPRINT, timeout_s=CALL_TIMEOUT_S) as client:
        for key, seed in written.items():
            client.put(key, _tensor(seed, 4), 4)
        # In flight on the victim's shard: leased, never written.
        assert client.reserve([(pending, 4)], 3000) == [Status.RESERVED]
        load = _Load(service.address, written)
        _poll(lambda: load.ok >= 20, "load running before the kill")

        victim.kill()
        seen_unavailable = []

        def victim_shard_answers() -> bool:
            try:
                client.get_many([(victim_keys[0], 4)], HIDDEN, torch.float32)
                return True
            except CacheUnavailable:
                seen_unavailable.append(True)
                return False

        _poll(victim_shard_answers, "the victim's shard answering again after failover")
        _poll(cluster.healthy, "cluster healthy with the replica promoted")
        assert victim.address not in {node.address for node in cluster.masters()}
        served = load.ok
        _poll(lambda: load.ok >= served + 20, "load served after the failover")
        load.stop()
        assert load.errors == [] and load.wrong == []

        # Written before the kill: served correctly or missing, never wrong.
        got = client.get_many([(key, 4) for key in written], HIDDEN, torch.float32)
        for key, seed in written.items():
            assert got[key] is None or torch.equal(got[key], _tensor(seed, 4))
        assert all(torch.equal(got[key], _tensor(written[key], 4)) for key in other_keys)

        # The PENDING entry on the failed shard: its lease expires (or was lost with the
        # master), and the next caller gets the lease and produces it.
        _poll(
            lambda: client.reserve([(pending, 4)], 3000) == [Status.RESERVED],
            "the stranded lease expiring",
        )
        client.put(pending, _tensor(99, 4), 4)
        fresh = client.get_many([(pending, 4)], HIDDEN, torch.float32)[pending]
        assert torch.equal(fresh, _tensor(99, 4))
    if seen_unavailable:  # the shard was seen down: the node is in the log
        assert victim.address in caplog.text


def test_cluster_fail_state_is_unavailable_naming_the_node_in_the_log_only(killable, caplog):
    caplog.set_level(logging.WARNING, logger="embedding_cache_svc")
    service, cluster = killable
    settings = service.server.settings
    victim = cluster.masters()[0]
    key = _keys_on(settings, cluster, victim, 1)[0]
    with CacheClient(service.address, FINGERPRINT, timeout_s=CALL_TIMEOUT_S) as client:
        client.put(key, _tensor(1, 4), 4)
        for node in [victim, *cluster.replicas_of(victim)]:
            node.kill()  # the shard and its replica: its slots are lost
        _poll(cluster.in_fail_state, "cluster_state:fail on the live nodes")

        def unavailable() -> CacheUnavailable | None:
            try:
                client.get_many([(key, 4)], HIDDEN, torch.float32)
            except CacheUnavailable as err:
                return err
            return None

        err = _poll(unavailable, "UNAVAILABLE for the lost shard")
    addresses = [node.address for node in cluster.nodes]
    assert not any(address in str(err) for address in addresses)
    assert any(address in caplog.text for address in addresses)
