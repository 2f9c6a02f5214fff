"""Open paths and metrics: a path that takes no body refuses one at once without reading
it (405 for a method other than GET / HEAD, 413 for a GET carrying one), and no key is
needed to get that answer, nor can an unauthenticated client make the gateway buffer
anything; /metrics is not on the client port but on its own, and names LLM pods by name,
never by address (a real gateway process: tests/gateway/hostile_door.py).

The raw requests announce a body they never send: a gateway that waited for it would
answer 408 at its body deadline instead."""

from __future__ import annotations

import json

import httpx
import pytest

from iris.metrics import GATEWAY_POD_REQUESTS_IN_FLIGHT, LABEL_LLM_POD
from tests.gateway.hostile_door import AUTH, raw_exchange


def announced(method: str, path: str, length: int, extra: str = "") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}Connection: close\r\n\r\n"
    ).encode()


def error_of(body: bytes) -> dict:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/docs", "/openapi.json"])
def test_a_post_to_an_open_path_is_405_before_its_body(hostile, path):
    status, headers, body = raw_exchange(hostile.port, announced("POST", path, 60 * 2**20))
    assert status == 405
    assert headers["allow"] == "GET, HEAD"
    assert error_of(body)["code"] == "method_not_allowed"


def test_a_get_with_a_body_is_413_before_its_body(hostile):
    status, _, body = raw_exchange(hostile.port, announced("GET", "/healthz", 10**9))
    assert status == 413
    assert "takes no request body" in error_of(body)["message"]
    chunked = announced("GET", "/readyz", 0).replace(
        b"Content-Length: 0", b"Transfer-Encoding: chunked"
    )
    status, _, _ = raw_exchange(hostile.port, chunked)
    assert status == 413


@pytest.mark.parametrize("path", ["/v1/completions", "/metrics", "/anything"])
def test_every_other_path_asks_for_the_key_before_the_body(hostile, path):
    status, _, body = raw_exchange(hostile.port, announced("POST", path, 10**6))
    assert status == 401
    assert error_of(body)["code"] == "invalid_api_key"


def test_metrics_are_on_their_own_port_and_name_pods_by_name(hostile):
    assert httpx.get(hostile.url + "/metrics", headers=AUTH).status_code == 404
    page = httpx.get(f"http://127.0.0.1:{hostile.metrics_port}/metrics").text
    pods = [
        line.split(f'{LABEL_LLM_POD}="', 1)[1].split('"', 1)[0]
        for line in page.splitlines()
        if line.startswith(GATEWAY_POD_REQUESTS_IN_FLIGHT + "{")
    ]
    assert pods == ["fake"]  # the scripted pod's own name (tests/gateway/fake_services.py)
    assert "127.0.0.1" not in page
    health = httpx.get(f"http://127.0.0.1:{hostile.metrics_port}/healthz")
    assert health.json() == {"ok": True}
