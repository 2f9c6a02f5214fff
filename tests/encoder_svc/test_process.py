"""`iris encoder --model DIR` as its own process: it loads the checkpoint, serves, stores
into a cache service, and exits cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import grpc
import httpx
import torch

from embedding_cache_svc.client import AsyncCacheClient
from embedding_cache_svc.server import CacheServer
from embedding_cache_svc.settings import CacheSettings
from encoder_svc.proto import encoder_pb2, encoder_pb2_grpc
from iris.up.processes import free_port
from tests.encoder_svc.stack import encode_item, png


async def _healthy(url: str, process: subprocess.Popen, log, timeout_s: float = 120.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with httpx.AsyncClient() as http:
        while asyncio.get_running_loop().time() < deadline:
            assert process.poll() is None, log.read_text()
            try:
                if (await http.get(url)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"{url} never became healthy")


async def test_iris_encoder_command_serves_and_stops_on_sigterm(qwen, tmp_path):
    cache = CacheServer(CacheSettings(host="127.0.0.1", port=0, metrics_port=0))
    await cache.start()
    port, metrics_port = free_port(), free_port()
    env = {
        **os.environ,
        "IRIS_ENCODER_PORT": str(port),
        "IRIS_ENCODER_METRICS_PORT": str(metrics_port),
        "IRIS_ENCODER_CACHE_ADDRESS": cache.address,
        "IRIS_ENCODER_TORCH_THREADS": "1",
    }
    argv = [sys.executable, "-m", "iris.cli", "encoder", "--model", str(qwen.model_dir)]
    log = tmp_path / "encoder.log"
    with log.open("w") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        await _healthy(f"http://127.0.0.1:{metrics_port}/healthz", process, log)
        item = encode_item(qwen, png(81, 200, 120))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = encoder_pb2_grpc.EncoderStub(channel)
            request = encoder_pb2.EncodeRequest(items=[item], fingerprint=qwen.fingerprint)
            reply = await stub.Encode(request)
        assert reply.results[0].ok
        async with AsyncCacheClient(cache.address, qwen.fingerprint) as client:
            key = (item.item.identity, item.item.token_count)
            stored = await client.get_many([key], 64, torch.float32)
        assert stored[item.item.identity].shape == (item.item.token_count, 64)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        await cache.stop(grace_s=0)
