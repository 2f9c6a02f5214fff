"""What an unauthenticated or greedy client can cost, on a real `iris gateway` process
(uvicorn on a loopback socket; raw sockets where a test must hold back a body), wired to
the scripted pod and encoder and the real cache process of tests/gateway/conftest.py.

Each limit is set small in the process's settings. The key is checked before the body is
read, a Content-Length over the limit is refused before buffering (both would otherwise
wait out the 1 s body deadline and answer 408), a trickled body is a 408, a request head
that never completes gets the connection closed, each key has its own request and
prompt-token buckets (429 with Retry-After), a request's images have a total byte and
pixel budget, an Encode too large for one message is a 413, uvicorn's concurrency is
bounded with a JSON 503 (on a second process whose deadlines are long, so that idle connections stay
open), and none of it logs a key, a prompt or an image.
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
from PIL import Image

from iris.up.processes import ChildProcess, free_port, wait_until
from tests.gateway.gateway_process import start_gateway

KEYS = {
    name: f"sk-{name}-{os.urandom(6).hex()}"
    for name in ("door", "rate", "other", "tokens", "images", "encode", "concurrency")
}
SECRET_WORDS = "zebra quartz lantern " * 40  # a long prompt, looked for in the log
MAX_BODY = 100_000
MAX_CONNECTIONS = 4  # of the roomy door


@dataclass
class Door:
    url: str
    port: int
    child: ChildProcess
    model: str


def start_door(parts, log_path, **settings: str):
    """An `iris gateway` process with the test's settings (IRIS_GATEWAY_<KEY>: value)."""
    port = free_port()
    env = {
        "IRIS_GATEWAY_MODEL": str(parts["model_dir"]),
        "IRIS_GATEWAY_HOST": "127.0.0.1",
        "IRIS_GATEWAY_PORT": str(port),
        "IRIS_GATEWAY_METRICS_PORT": "0",  # any free port: two doors run at once
        "IRIS_GATEWAY_LLM_ADDRESSES": parts["pod_address"],
        "IRIS_GATEWAY_ENCODER_ADDRESSES": parts["encoder_address"],
        "IRIS_GATEWAY_CACHE_ADDRESS": parts["cache_address"],
        "IRIS_GATEWAY_API_KEYS": json.dumps(list(KEYS.values())),
        "IRIS_GATEWAY_MAX_BODY_BYTES": str(MAX_BODY),
        "IRIS_GATEWAY_BODY_TIMEOUT_S": "1",
        # Longer than the body's: a client here sends its head at once, even on a busy machine.
        "IRIS_GATEWAY_HEADER_TIMEOUT_S": "3",
        # Rates so slow that nothing refills during the test: only the bursts count.
        "IRIS_GATEWAY_KEY_REQUESTS_PER_S": "0.0001",
        "IRIS_GATEWAY_KEY_REQUEST_BURST": "3",
        "IRIS_GATEWAY_KEY_PROMPT_TOKENS_PER_S": "0.0001",
        "IRIS_GATEWAY_KEY_PROMPT_TOKEN_BURST": "100",
        "IRIS_GATEWAY_MAX_REQUEST_IMAGE_BYTES": "25000",
        "IRIS_GATEWAY_MAX_REQUEST_IMAGE_PIXELS": str(3 * 64 * 48),
        "IRIS_GATEWAY_MAX_ENCODE_MESSAGE_BYTES": "14000",
        "IRIS_GATEWAY_LOAD_POLL_INTERVAL_S": "0.1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        **{f"IRIS_GATEWAY_{key.upper()}": value for key, value in settings.items()},
    }
    child, url = start_gateway(env, port, log_path)
    return Door(url, port, child, parts["model_dir"].name)


@pytest.fixture(scope="module")
def door(qwen_gateway_parts, tmp_path_factory):
    running = start_door(qwen_gateway_parts, tmp_path_factory.mktemp("door") / "gateway.log")
    yield running
    running.child.stop()


@pytest.fixture(scope="module")
def roomy_door(qwen_gateway_parts, tmp_path_factory):
    """Long head and body deadlines, few connections."""
    log_path = tmp_path_factory.mktemp("roomy-door") / "gateway.log"
    running = start_door(
        qwen_gateway_parts,
        log_path,
        header_timeout_s="600",
        body_timeout_s="600",
        max_connections=str(MAX_CONNECTIONS),
    )
    yield running
    running.child.stop()


def auth(name: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def raw_exchange(port: int, head: str, body: bytes = b"") -> tuple[int, dict, dict]:
    """Send `head` (and `body`, possibly short of its Content-Length) and read the answer:
    (status, headers, JSON body). Waits up to 30 s for the gateway to answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        header_text, _, rest = data.partition(b"\r\n\r\n")
        lines = header_text.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            rest += sock.recv(65536)
    return int(lines[0].split()[1]), headers, json.loads(rest[:length] or b"{}")


def post_head(length: int, key: str | None = None) -> str:
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        "Host: gateway",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        "Connection: close",
    ]
    if key:
        lines.append(f"Authorization: Bearer {KEYS[key]}")
    return "\r\n".join(lines) + "\r\n"


def openai_error(body: dict) -> dict:
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_no_key_is_refused_before_the_body_is_read(door):
    port = door.port
    status, _, body = raw_exchange(port, post_head(50_000))  # no body is ever sent
    assert status == 401
    assert openai_error(body)["code"] == "invalid_api_key"


def test_a_wrong_key_is_refused_before_the_body_is_read(door):
    port = door.port
    head = post_head(50_000).replace("Connection", "Authorization: Bearer nope\r\nConnection")
    status, _, body = raw_exchange(port, head)
    assert status == 401
    assert openai_error(body)["message"] == "invalid API key"


def test_a_content_length_over_the_limit_is_413_before_buffering(door):
    port = door.port
    status, _, body = raw_exchange(port, post_head(10**9, "door"))
    assert status == 413
    assert f"limit of {MAX_BODY} bytes" in openai_error(body)["message"]


def test_a_trickled_body_ends_at_the_body_deadline(door):
    port = door.port
    status, _, body = raw_exchange(port, post_head(1000, "door"), b'{"model": ')
    assert status == 408
    assert "not received within 1 s" in openai_error(body)["message"]


def test_each_key_has_its_own_request_bucket(door):
    url = door.url
    for _ in range(3):  # the burst
        assert httpx.get(url + "/v1/models", headers=auth("rate")).status_code == 200
    refused = httpx.get(url + "/v1/models", headers=auth("rate"))
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    error = openai_error(refused.json())
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert "requests per second" in error["message"]
    # Another key is not held back by this one.
    assert httpx.get(url + "/v1/models", headers=auth("other")).status_code == 200


def chat(door: Door, key: str, content) -> httpx.Response:
    body = {
        "model": door.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 2,
    }
    return httpx.post(door.url + "/v1/chat/completions", json=body, headers=auth(key), timeout=30)


def test_prompt_tokens_are_charged_to_the_key(door):
    url = door.url
    first = chat(door, "tokens", SECRET_WORDS)  # ~120 prompt tokens: over the burst of 100
    assert first.status_code == 200, first.text
    assert first.json()["usage"]["prompt_tokens"] > 100
    refused = httpx.get(url + "/v1/models", headers=auth("tokens"))
    assert refused.status_code == 429
    assert "prompt tokens per second" in openai_error(refused.json())["message"]


def noise_png(seed: int, height: int = 48, width: int = 64) -> str:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    noise = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def with_images(*urls: str) -> list[dict]:
    return [{"type": "text", "text": "Compare."}] + [
        {"type": "image_url", "image_url": {"url": url}} for url in urls
    ]


def fresh_seeds(count: int) -> list[int]:
    base = int.from_bytes(os.urandom(4), "big")
    return [base + i for i in range(count)]


def test_the_images_of_a_request_share_a_byte_budget(door):
    urls = [noise_png(seed) for seed in fresh_seeds(3)]  # ~9.3 kB each: 3 are over 25 kB
    refused = chat(door, "images", with_images(*urls))
    assert refused.status_code == 413
    assert "per-request limit of 25000" in openai_error(refused.json())["message"]


def test_the_images_of_a_request_share_a_pixel_budget(door):
    solid = io.BytesIO()
    Image.new("RGB", (64, 48), "red").save(solid, "PNG")
    tiny = "data:image/png;base64," + base64.b64encode(solid.getvalue()).decode()
    refused = chat(door, "images", with_images(tiny, tiny, tiny, tiny))  # 4 x 3072 pixels
    assert refused.status_code == 413
    assert f"per-request limit of {3 * 64 * 48}" in openai_error(refused.json())["message"]


def test_an_image_too_large_for_any_encode_message_is_413(door):
    one, two, big = fresh_seeds(3)
    # Two new images (~9.2 KB each) do not fit one 14,000-byte Encode message together:
    # they go in two.
    assert chat(door, "encode", with_images(noise_png(one), noise_png(two))).status_code == 200
    # One of ~20.7 KB (within the request's 25,000 image bytes and its pixels) fits none.
    refused = chat(door, "encode", with_images(noise_png(big, 72, 96)))
    assert refused.status_code == 413
    message = openai_error(refused.json())["message"]
    assert "an image to encode" in message and "over the limit of 14000" in message


def closed_by_the_server(sock: socket.socket) -> bool:
    """True once the server closes; our 30 s socket timeout would raise instead."""
    sock.settimeout(30)
    return sock.recv(1024) == b""


def test_a_request_head_that_never_completes_is_closed(door):
    trickling = socket.create_connection(("127.0.0.1", door.port))
    silent = socket.create_connection(("127.0.0.1", door.port))
    with trickling, silent:
        trickling.sendall(b"GET /healthz HTTP/1.1\r\nHost: gat")  # and no more
        assert closed_by_the_server(trickling)
        assert closed_by_the_server(silent)
    # A whole request on a fresh connection is served as ever.
    assert httpx.get(door.url + "/healthz").status_code == 200


def test_connections_are_bounded_with_a_json_503(roomy_door):
    url, port = roomy_door.url, roomy_door.port
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_CONNECTIONS)]
    try:
        refused = httpx.get(url + "/healthz")  # one more than the limit
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        error = openai_error(refused.json())
        assert error["code"] == "overloaded"
        assert f"limit is {MAX_CONNECTIONS}" in error["message"]
    finally:
        for sock in idle:
            sock.close()
    assert wait_until(lambda: httpx.get(url + "/healthz").status_code == 200, 30)


def test_nothing_secret_reaches_the_log(door):
    """Runs last in this module: every refusal above was logged by then."""
    child = door.child
    log = child.log_path.read_text(errors="replace")
    assert "refused POST '/v1/chat/completions'" in log  # the refusals are logged...
    for key in KEYS.values():  # ...but never a key, the prompt, or image data
        assert key not in log
    assert "zebra quartz" not in log
    assert "base64" not in log and "iVBORw0KGgo" not in log
