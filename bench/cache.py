"""Embedding cache: client BatchGet through the service (Redis store, L1 off) against a raw
redis-py GET of the same stored bytes on the same Redis, side by side in one run, beside
the floor of gRPC itself (bench/grpc_echo.py: the same client channel to a grpc.aio
server answering from memory, no Redis); and the client's L1 hit time. With --cluster,
the same on a local Redis Cluster (3 masters + 3 replicas) in the same run, then the
failover gap.

    .venv/bin/python bench/cache.py [--sizes 1,8,32] [--repeats 15] [--chunk-kb N] [--read-kb N]
    .venv/bin/python bench/cache.py --cluster [--sizes 1,8]

Starts its own redis-server(s), `iris cache` process(es) and the echo server on free
loopback ports. Prints, per size, `SIZE: service X ms, raw Y ms, ratio R, added A ms`
(medians; `cluster SIZE:` for the cluster) and the floor beside it: an empty gRPC call and
the SIZE echoed in one message and in the service's chunks (added can only go below the
echo by overlapping it with the Redis read); then `L1 hit: X us`; with --cluster, per size
how much more the service adds on the cluster than on one node, and `failover gap: X s`
(a master killed with kill -9 to the first successful Get of a key on its shard).
Targets: at 1 MB the service adds <= 0.5 ms over raw, at 8 MB ratio <= 1.3 (issue 22); on
the cluster it adds no more than on one node, within 0.3 ms (issue 23); L1 hit <= 50 us.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import redis  # noqa: E402
import torch  # noqa: E402
from redis.cluster import ClusterNode, RedisCluster, key_slot  # noqa: E402
from redis.utils import HIREDIS_AVAILABLE  # noqa: E402

from embedding_cache_svc.client import CacheClient, CacheUnavailable  # noqa: E402
from embedding_cache_svc.settings import CacheSettings  # noqa: E402
from iris_kernels import checksum  # noqa: E402
from tests.fixtures.redis_cluster import RedisCluster as LocalCluster  # noqa: E402
from tests.fixtures.redis_server import RedisServer, free_port  # noqa: E402

HIDDEN = 4096
FINGERPRINT = bytes(range(32))
PREFIX = b"iris:"


def start_service(
    store_args: list[str], chunk_bytes: int | None, read_bytes: int | None
) -> tuple[subprocess.Popen, str]:
    port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRIS_CACHE_")}
    env["IRIS_CACHE_LOG_LEVEL"] = "WARNING"
    if chunk_bytes:
        env["IRIS_CACHE_CHUNK_BYTES"] = str(chunk_bytes)
    if read_bytes:
        env["IRIS_CACHE_REDIS_READ_BYTES"] = str(read_bytes)
    if store_args[0] == "redis-cluster":
        env["IRIS_CACHE_REDIS_CLUSTER_NODES"] = store_args[1]
        command = [sys.executable, "-m", "iris.cli", "cache", "--store", "redis-cluster"]
    else:
        command = [sys.executable, "-m", "iris.cli", "cache", "--store", "redis"]
        command += ["--redis-url", store_args[1]]
    command += ["--port", str(port), "--metrics-port", str(metrics_port)]
    process = subprocess.Popen(command, env=env, cwd=ROOT)
    address = f"127.0.0.1:{port}"
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
    return process, address


class EchoFloor:
    """bench/grpc_echo.py in a process of its own, called over a channel like the client's."""

    def __init__(self, chunk_bytes: int) -> None:
        port = free_port()
        command = [sys.executable, str(ROOT / "bench" / "grpc_echo.py"), str(port)]
        self.process = subprocess.Popen([*command, str(chunk_bytes)], cwd=ROOT)
        self.chunk_kb = chunk_bytes // 1024
        # The cache client's own channel options (the sync client's single-threaded stream
        # reads included), with room for the one-message echo of the largest size.
        limit = 64 << 20
        options = [o for o in CacheClient.channel_options if "message_length" not in o[0]]
        options += [("grpc.max_receive_message_length", limit)]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
        grpc.channel_ready_future(self.channel).result(timeout=60)
        self._empty = self.channel.unary_unary("/bench.Echo/Empty")
        self._unary = self.channel.unary_unary("/bench.Echo/Unary")
        self._stream = self.channel.unary_stream("/bench.Echo/Stream")

    def empty(self) -> None:
        self._empty(b"", timeout=30)

    def unary(self, nbytes: int) -> Callable[[], None]:
        request = str(nbytes).encode()
        return lambda: self._unary(request, timeout=30)

    def stream(self, nbytes: int) -> Callable[[], None]:
        request = str(nbytes).encode()

        def consume() -> None:
            for _ in self._stream(request, timeout=30):
                pass

        return consume

    def close(self) -> None:
        self.channel.close()
        self.process.terminate()
        self.process.wait(30)


def entry_name(key: bytes) -> bytes:
    """The Redis key of an item (docs/design/cache.md)."""
    return PREFIX + b"e:{" + (FINGERPRINT + key).hex().encode() + b"}"


def timed_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


class Target:
    """One store under test: the service in front of it and a raw client of it."""

    def __init__(self, label: str, client: CacheClient, raw) -> None:
        self.label, self.client, self.raw = label, client, raw

    def prepare(self, megabytes: int) -> tuple[Callable[[], None], Callable[[], None], float]:
        rows = megabytes * (1 << 20) // (HIDDEN * 4)
        tensor = torch.randn(rows, HIDDEN)
        key = os.urandom(32)
        self.client.put(key, tensor, rows)
        name = entry_name(key)
        stored = self.raw.get(name)
        assert stored is not None and len(stored) >= tensor.numel() * 4

        def via_service() -> None:
            assert self.client.get_many([(key, rows)], HIDDEN, torch.float32)[key] is not None

        def via_raw() -> None:
            assert self.raw.get(name) is not None

        verify_ms = statistics.median(timed_ms(lambda: checksum(tensor)) for _ in range(5))
        return via_service, via_raw, verify_ms


def bench_size(
    targets: list[Target], floor: EchoFloor, megabytes: int, repeats: int
) -> dict[str, float]:
    """Per target the service's added ms over raw at this size, all measured interleaved
    with the gRPC floor."""
    prepared = [target.prepare(megabytes) for target in targets]
    nbytes = megabytes << 20
    floors = {"empty": floor.empty, "one": floor.unary(nbytes), "chunks": floor.stream(nbytes)}
    for via_service, via_raw, _ in prepared:
        via_service(), via_raw()  # warm connections and buffers
    for measure in floors.values():
        measure()
    times: list[tuple[list[float], list[float]]] = [([], []) for _ in targets]
    floor_ms: dict[str, list[float]] = {name: [] for name in floors}
    for _ in range(repeats):  # interleaved, so drift on a noisy machine hits all alike
        for (via_service, via_raw, _), (service_ms, raw_ms) in zip(prepared, times, strict=True):
            service_ms.append(timed_ms(via_service))
            raw_ms.append(timed_ms(via_raw))
        for name, measure in floors.items():
            floor_ms[name].append(timed_ms(measure))
    added = {}
    for target, (_, _, verify_ms), (service_ms, raw_ms) in zip(
        targets, prepared, times, strict=True
    ):
        s, r = statistics.median(service_ms), statistics.median(raw_ms)
        added[target.label] = s - r
        name = f"{target.label} {megabytes} MB" if target.label else f"{megabytes} MB"
        print(
            f"{name}: service {s:.2f} ms, raw {r:.2f} ms, ratio {s / r:.2f}, added {s - r:.2f} ms",
            flush=True,
        )
        print(f"    (of which checksum verify on the client: {verify_ms:.2f} ms)", flush=True)
    empty, one, chunks = (statistics.median(floor_ms[name]) for name in floors)
    print(
        f"    floor, gRPC alone (no Redis): empty call {empty:.2f} ms; {megabytes} MB echoed "
        f"in one message {one:.2f} ms, in {floor.chunk_kb} KiB messages {chunks:.2f} ms",
        flush=True,
    )
    return added


def bench_l1(address: str, iterations: int) -> None:
    rows = 8 * (1 << 20) // (HIDDEN * 4)
    key = os.urandom(32)
    with CacheClient(address, FINGERPRINT, l1_bytes=1 << 30) as client:
        client.put(key, torch.randn(rows, HIDDEN), rows)
        client.get_many([(key, rows)], HIDDEN, torch.float32)  # fills the L1
        request = [(key, rows)]
        start = time.perf_counter()
        for _ in range(iterations):
            client.get_many(request, HIDDEN, torch.float32)
        per_hit_us = (time.perf_counter() - start) / iterations * 1e6
        assert client.l1.hits == iterations
    print(f"L1 hit: {per_hit_us:.1f} us (8 MB entry, mean of {iterations})", flush=True)


def failover_gap(cluster: LocalCluster, client: CacheClient, deadline_s: float = 120.0) -> None:
    """kill -9 the master of a stored key; time until a Get of that key succeeds again."""
    rows = (1 << 20) // (HIDDEN * 4)
    key = os.urandom(32)
    client.put(key, torch.randn(rows, HIDDEN), rows)
    victim = cluster.master_of_slot(key_slot(entry_name(key)))
    victim.kill()
    killed = time.monotonic()
    refused = 0
    while time.monotonic() - killed < deadline_s:
        try:
            got = client.get_many([(key, rows)], HIDDEN, torch.float32)[key]
            gap = time.monotonic() - killed
            kept = "kept" if got is not None else "lost (not yet replicated)"
            print(
                f"failover gap: {gap:.2f} s (kill -9 of a master to the first successful Get "
                f"on its shard; {refused} UNAVAILABLE answers before; the entry was {kept})",
                flush=True,
            )
            return
        except CacheUnavailable:
            refused += 1
            time.sleep(0.01)
    print(f"failover gap: over {deadline_s:.0f} s (no successful Get)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,32", help="entry sizes in MB")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--l1-iterations", type=int, default=2000)
    parser.add_argument("--chunk-kb", type=int, help="service gRPC chunk (default: its own)")
    parser.add_argument("--read-kb", type=int, help="service Redis read size (default: its own)")
    parser.add_argument("--cluster", action="store_true", help="also on a local Redis Cluster")
    args = parser.parse_args()
    chunk = args.chunk_kb and args.chunk_kb * 1024
    read = args.read_kb and args.read_kb * 1024
    parser = "hiredis" if HIREDIS_AVAILABLE else "pure Python (hiredis not installed)"
    print(f"redis-py reply parser, service and raw alike: {parser}", flush=True)
    server = RedisServer("/usr/bin/redis-server")
    server.start()
    cluster = LocalCluster(node_timeout_ms=1000) if args.cluster else None
    processes: list[subprocess.Popen] = []
    floor = EchoFloor(chunk or CacheSettings.model_fields["chunk_bytes"].default)
    try:
        process, address = start_service(["redis", server.url], chunk, read)
        processes.append(process)
        targets = [
            Target(
                "",
                CacheClient(address, FINGERPRINT, timeout_s=30),
                redis.Redis.from_url(server.url),
            )
        ]
        if cluster is not None:
            cluster.start()
            seeds = ",".join(cluster.addresses)
            process, cluster_address = start_service(["redis-cluster", seeds], chunk, read)
            processes.append(process)
            nodes = [ClusterNode("127.0.0.1", int(a.rpartition(":")[2])) for a in cluster.addresses]
            cluster_client = CacheClient(cluster_address, FINGERPRINT, timeout_s=30)
            targets.append(Target("cluster", cluster_client, RedisCluster(startup_nodes=nodes)))
        for size in (int(part) for part in args.sizes.split(",")):
            added = bench_size(targets, floor, size, args.repeats)
            if cluster is not None:
                more = added["cluster"] - added[""]
                print(
                    f"{size} MB: the cluster adds {more:+.2f} ms more than one node "
                    f"(target <= 0.3)",
                    flush=True,
                )
        bench_l1(address, args.l1_iterations)
        if cluster is not None:
            failover_gap(cluster, targets[1].client)
    finally:
        floor.close()
        for process in processes:
            process.terminate()
            process.wait(30)
        server.close()
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    main()
