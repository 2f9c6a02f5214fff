"""Embedding cache: client BatchGet through the service (Redis store, L1 off) against a raw
redis-py GET of the same stored bytes on the same Redis, side by side in one run; and the
client's L1 hit time.

    .venv/bin/python bench/cache.py [--sizes 1,8,32] [--repeats 15] [--chunk-kb N] [--read-kb N]

Starts its own redis-server and `iris cache` process on free loopback ports. Prints, per
size, `SIZE: service X ms, raw Y ms, ratio R, added A ms` (medians), then `L1 hit: X us`.
Targets: at 1 MB the service adds <= 0.5 ms over raw, at 8 MB ratio <= 1.3 (issue 22);
L1 hit <= 50 us (issue 5).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import redis  # noqa: E402
import torch  # noqa: E402

from embedding_cache_svc.client import CacheClient  # noqa: E402
from kernels import checksum  # noqa: E402
from tests.fixtures.redis_server import RedisServer, free_port  # noqa: E402

HIDDEN = 4096
FINGERPRINT = bytes(range(32))
PREFIX = b"iris:"


def start_service(
    redis_url: str, chunk_bytes: int | None, read_bytes: int | None
) -> tuple[subprocess.Popen, str]:
    port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRIS_CACHE_")}
    env["IRIS_CACHE_LOG_LEVEL"] = "WARNING"
    if chunk_bytes:
        env["IRIS_CACHE_CHUNK_BYTES"] = str(chunk_bytes)
    if read_bytes:
        env["IRIS_CACHE_REDIS_READ_BYTES"] = str(read_bytes)
    command = [sys.executable, "-m", "iris.cli", "cache", "--store", "redis"]
    command += ["--redis-url", redis_url, "--port", str(port), "--metrics-port", str(metrics_port)]
    process = subprocess.Popen(command, env=env, cwd=ROOT)
    address = f"127.0.0.1:{port}"
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
    return process, address


def timed_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def bench_size(client: CacheClient, raw: redis.Redis, megabytes: int, repeats: int) -> float:
    rows = megabytes * (1 << 20) // (HIDDEN * 4)
    tensor = torch.randn(rows, HIDDEN)
    key = os.urandom(32)
    client.put(key, tensor, rows)
    raw_key = PREFIX + b"e:{" + (FINGERPRINT + key).hex().encode() + b"}"
    stored = raw.get(raw_key)
    assert stored is not None and len(stored) >= tensor.numel() * 4

    def via_service() -> None:
        got = client.get_many([(key, rows)], HIDDEN, torch.float32)[key]
        assert got is not None

    def via_raw() -> None:
        assert raw.get(raw_key) is not None

    via_service(), via_raw()  # warm connections and buffers
    service_ms, raw_ms = [], []
    for _ in range(repeats):  # interleaved, so drift on a noisy machine hits both alike
        service_ms.append(timed_ms(via_service))
        raw_ms.append(timed_ms(via_raw))
    verify_ms = statistics.median(timed_ms(lambda: checksum(tensor)) for _ in range(5))
    s, r = statistics.median(service_ms), statistics.median(raw_ms)
    print(
        f"{megabytes} MB: service {s:.2f} ms, raw {r:.2f} ms, ratio {s / r:.2f}, "
        f"added {s - r:.2f} ms",
        flush=True,
    )
    print(f"    (of which checksum verify on the client: {verify_ms:.2f} ms)", flush=True)
    return s - r


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,32", help="entry sizes in MB")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--l1-iterations", type=int, default=2000)
    parser.add_argument("--chunk-kb", type=int, help="service gRPC chunk (default: its own)")
    parser.add_argument("--read-kb", type=int, help="service Redis read size (default: its own)")
    args = parser.parse_args()
    server = RedisServer("/usr/bin/redis-server")
    server.start()
    process = None
    try:
        process, address = start_service(
            server.url, args.chunk_kb and args.chunk_kb * 1024, args.read_kb and args.read_kb * 1024
        )
        raw = redis.Redis.from_url(server.url)
        with CacheClient(address, FINGERPRINT, timeout_s=30) as client:
            for size in (int(part) for part in args.sizes.split(",")):
                bench_size(client, raw, size, args.repeats)
        bench_l1(address, args.l1_iterations)
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        server.close()


if __name__ == "__main__":
    main()
