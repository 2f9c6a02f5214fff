"""A real `iris gateway` process with small, known door limits, shared by the hostile-input
test modules (tests/gateway/test_hostile_*.py) through the session fixture `hostile` in
tests/gateway/conftest.py; wired to the scripted pod and encoder and the real cache."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass

import httpx

from iris.up.processes import ChildProcess, free_port
from tests.gateway.gateway_process import start_gateway

KEY = f"sk-hostile-{os.urandom(6).hex()}"
AUTH = {"Authorization": f"Bearer {KEY}"}
# The process's limits (IRIS_GATEWAY_<NAME>), small so that each test's body stays small.
LIMITS = {
    "max_body_bytes": 400_000,
    "max_completions_body_bytes": 100_000,
    "max_body_values": 30_000,
    "max_body_objects": 9_000,
    "max_model_len": 512,
    "max_connections": 64,
    "max_requests_in_progress": 2,  # two held bodies fill it (test_hostile_head.py)
    # Most bodies of these tests go through the parse processes (gateway/parsing/).
    "parse_in_process_max_bytes": 4096,
}


@dataclass
class Hostile:
    url: str
    port: int
    metrics_port: int
    child: ChildProcess
    model: str

    def post(self, path: str, body, **kwargs) -> httpx.Response:
        """POST a JSON body (or raw bytes) with the key."""
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {**AUTH, "Content-Type": "application/json", **kwargs.pop("headers", {})}
        return httpx.post(self.url + path, content=content, headers=headers, timeout=60, **kwargs)

    def chat(self, **fields) -> httpx.Response:
        body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}], **fields}
        return self.post("/v1/chat/completions", body)

    def complete(self, **fields) -> httpx.Response:
        body = {"model": self.model, "prompt": "hi", "max_tokens": 4, **fields}
        return self.post("/v1/completions", body)


def start_hostile(parts, log_path) -> Hostile:
    port, metrics_port = free_port(), free_port()
    env = {
        "IRIS_GATEWAY_MODEL": str(parts["model_dir"]),
        "IRIS_GATEWAY_HOST": "127.0.0.1",
        "IRIS_GATEWAY_PORT": str(port),
        "IRIS_GATEWAY_METRICS_PORT": str(metrics_port),
        "IRIS_GATEWAY_LLM_ADDRESSES": parts["pod_address"],
        "IRIS_GATEWAY_ENCODER_ADDRESSES": parts["encoder_address"],
        "IRIS_GATEWAY_CACHE_ADDRESS": parts["cache_address"],
        "IRIS_GATEWAY_API_KEYS": json.dumps([KEY]),
        "IRIS_GATEWAY_LOAD_POLL_INTERVAL_S": "0.1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        **{f"IRIS_GATEWAY_{name.upper()}": str(value) for name, value in LIMITS.items()},
    }
    child, url = start_gateway(env, port, log_path)
    return Hostile(url, port, metrics_port, child, parts["model_dir"].name)


def openai_error(response: httpx.Response, status: int) -> dict:
    """The error of a response that must be `status` in OpenAI's shape, with no repr,
    address or path in its message."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    message = error["message"]
    for leak in (" object at 0x", "127.0.0.1", "/work/", "/tmp/", "Traceback"):
        assert leak not in message, message
    return error


def raw_exchange(port: int, request: bytes) -> tuple[int, dict, bytes]:
    """Send raw bytes and read one answer: (status, headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    return int(lines[0].split()[1]), headers, rest[:length]
