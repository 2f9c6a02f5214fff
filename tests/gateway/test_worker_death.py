"""Worker processes killed while idle, in a real gateway process (tiny Qwen3-VL, scripted
pod and encoder, real cache): the next large body and the next video are answered as if
nothing had happened, each pool replaced by the request that found it broken
(gateway/worker_pool.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest

from iris.models import load_adapter
from iris.up.processes import free_port
from tests.fixtures.videos import encode_video, source_frames
from tests.gateway.fake_services import PodScript, serve_encoder, serve_pod
from tests.gateway.gateway_process import start_gateway
from tests.gateway.helpers import data_url, eventually

PARSE_THRESHOLD = 4096


@pytest.fixture(scope="module")
def gateway(tiny_qwen3_vl_dir, cache_process, tmp_path_factory):
    pod_server, pod_address, _ = serve_pod(PodScript(load_adapter(tiny_qwen3_vl_dir).fingerprint))
    encoder_server, encoder_address, _ = serve_encoder()
    port = free_port()
    env = {
        "IRIS_GATEWAY_MODEL": str(tiny_qwen3_vl_dir),
        "IRIS_GATEWAY_HOST": "127.0.0.1",
        "IRIS_GATEWAY_PORT": str(port),
        "IRIS_GATEWAY_METRICS_PORT": str(free_port()),
        "IRIS_GATEWAY_LLM_ADDRESSES": pod_address,
        "IRIS_GATEWAY_ENCODER_ADDRESSES": encoder_address,
        "IRIS_GATEWAY_CACHE_ADDRESS": cache_process.cache_address,
        "IRIS_GATEWAY_PARSE_IN_PROCESS_MAX_BYTES": str(PARSE_THRESHOLD),
        "IRIS_GATEWAY_PARSE_WORKERS": "1",
        "IRIS_GATEWAY_VIDEO_DECODE_WORKERS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    log = tmp_path_factory.mktemp("worker-death") / "gateway.log"
    child, url = start_gateway(env, port, log)
    yield child, url, tiny_qwen3_vl_dir.name
    child.stop()
    pod_server.stop(0)
    encoder_server.stop(0)


def large_body(model: str) -> bytes:
    """A chat body past the parse threshold (JSON whitespace): parsed in a worker."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return b" " * PARSE_THRESHOLD + json.dumps(body).encode()


def video_body(model: str) -> bytes:
    video = data_url(encode_video(source_frames(8, 64, 32)), "video/x-matroska")
    content = [
        {"type": "text", "text": "what happens?"},
        {"type": "video_url", "video_url": {"url": video}},
    ]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    return json.dumps(body).encode()


def post(url: str, body: bytes) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    return httpx.post(f"{url}/v1/chat/completions", content=body, headers=headers, timeout=120)


def spawned_workers(pid: int) -> list[int]:
    """The multiprocessing workers among `pid`'s children (not its resource tracker)."""
    workers = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and b"spawn_main" in command:
            workers.append(int(entry.name))
    return workers


def test_killed_idle_workers_leave_the_next_large_body_and_video_answered(gateway):
    child, url, model = gateway
    for body in (large_body(model), video_body(model)):  # both pools started and idle
        response = post(url, body)
        assert response.status_code == 200, response.text
    workers = spawned_workers(child.pid)
    assert len(workers) == 2, workers  # one parse worker, one video decoder
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    # Reaped by their pools' threads: each pool now knows it is broken.
    eventually(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers))
    for body in (large_body(model), video_body(model)):
        response = post(url, body)
        assert response.status_code == 200, response.text
    assert len(spawned_workers(child.pid)) == 2
    assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
