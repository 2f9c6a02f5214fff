"""What large bodies hold of /dev/shm, in a real gateway process (scripted pod, real cache):
a body's segment is sized from its Content-Length and freed once it is parsed, before the
request is routed, so requests held open hold none; a chunked body, whose size is unknown,
grows its segment as it arrives (gateway/parsing/shared_body.py)."""

from __future__ import annotations

import json
import os
import threading
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest

from iris.up.processes import free_port
from llm_svc.proto import llm_pb2_grpc
from tests.gateway.fake_services import FakePod, PodScript
from tests.gateway.gateway_process import start_gateway
from tests.gateway.helpers import eventually

HELD = 16


@pytest.fixture(scope="module")
def gateway(qwen_gateway_parts, tmp_path_factory):
    # Room for every held request's Generate (and the gateway's event stream) at once.
    pod = FakePod(PodScript(qwen_gateway_parts["adapter"].fingerprint))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2 * HELD))
    llm_pb2_grpc.add_LLMServicer_to_server(pod, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    port = free_port()
    env = {
        "IRIS_GATEWAY_MODEL": str(qwen_gateway_parts["model_dir"]),
        "IRIS_GATEWAY_HOST": "127.0.0.1",
        "IRIS_GATEWAY_PORT": str(port),
        "IRIS_GATEWAY_METRICS_PORT": str(free_port()),
        "IRIS_GATEWAY_LLM_ADDRESSES": address,
        "IRIS_GATEWAY_ENCODER_ADDRESSES": qwen_gateway_parts["encoder_address"],
        "IRIS_GATEWAY_CACHE_ADDRESS": qwen_gateway_parts["cache_address"],
        # Requests held at the pod must not shrink its admission limit (429s).
        "IRIS_GATEWAY_ADMISSION_WAIT_FACTOR": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    child, url = start_gateway(env, port, tmp_path_factory.mktemp("shm") / "gateway.log")
    yield child, url, pod, qwen_gateway_parts["model_dir"].name
    child.stop()
    server.stop(0)


def padded_body(model: str, size: int) -> bytes:
    """A chat body of `size` bytes, padded with JSON whitespace (parsed in a worker)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    return body.encode() + b" " * (size - len(body))


def shared_memory_held(pid: int) -> int:
    """Bytes of the /dev/shm segments that process `pid` has open (each counted once: a
    mapped segment holds two descriptors)."""
    sizes = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                found = os.stat(f"/proc/{pid}/fd/{fd}")
                sizes[found.st_ino] = found.st_size
        except OSError:  # closed meanwhile
            continue
    return sum(sizes.values())


def post(url: str, content, headers=None) -> httpx.Response:
    headers = {"Content-Type": "application/json", **(headers or {})}
    return httpx.post(f"{url}/v1/chat/completions", content=content, headers=headers, timeout=120)


def test_requests_held_open_hold_no_body_segment(gateway):
    child, url, pod, model = gateway
    gate = threading.Event()
    pod.script.accept_gate = gate  # every Generate waits here: the requests stay open
    body = padded_body(model, 40_000)
    with ThreadPoolExecutor(HELD) as senders:
        try:
            replies = [senders.submit(post, url, body) for _ in range(HELD)]
            eventually(lambda: len(pod.requests) == HELD)  # all parsed, routed and held
            assert shared_memory_held(child.pid) <= 2 * 1024 * 1024
        finally:
            gate.set()
            pod.script.accept_gate = None
        assert [reply.result().status_code for reply in replies] == [200] * HELD


def test_a_chunked_body_of_5_mb_parses(gateway):
    _, url, pod, model = gateway
    body = padded_body(model, 5 * 1024 * 1024)
    chunks = (body[start : start + 65536] for start in range(0, len(body), 65536))
    reply = post(url, chunks)  # a generator: sent chunked, with no Content-Length
    assert reply.status_code == 200, reply.text
    assert reply.request.headers.get("transfer-encoding") == "chunked"
