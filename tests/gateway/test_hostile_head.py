"""The request head and concurrency: a request line past 8 KiB is a 414 and headers past
16 KiB a 431, counted by the protocol subclass even when the whole head arrives at once;
an unparsable request is a JSON 400; past the requests-in-progress bound, a JSON 503 with
Retry-After (the connection bound is tests/gateway/test_door.py's). Every one of them in
OpenAI's error shape (a real gateway process: tests/gateway/hostile_door.py)."""

from __future__ import annotations

import json
import socket

import httpx

from gateway.http_protocol import HeadLimits
from iris.up.processes import wait_until
from tests.gateway.hostile_door import AUTH, LIMITS, raw_exchange

LIMITS_HEAD = HeadLimits()


def error_of(body: bytes) -> dict:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_long_request_line_is_a_json_414(hostile):
    path = "/healthz?" + "a" * LIMITS_HEAD.line_bytes
    status, headers, body = raw_exchange(hostile.port, f"GET {path} HTTP/1.1\r\n\r\n".encode())
    assert status == 414
    assert headers["content-type"] == "application/json"
    assert f"limit of {LIMITS_HEAD.line_bytes} bytes" in error_of(body)["message"]


def test_a_large_header_block_is_a_json_431_even_in_one_piece(hostile):
    filler = "".join(f"X-Filler-{i}: {'b' * 1000}\r\n" for i in range(17))  # ~17 KiB
    request = f"GET /healthz HTTP/1.1\r\nHost: gateway\r\n{filler}\r\n".encode()
    status, _, body = raw_exchange(hostile.port, request)
    assert status == 431
    assert f"limit of {LIMITS_HEAD.header_bytes} bytes" in error_of(body)["message"]
    # Just under the limit is served.
    fits = "".join(f"X-Filler-{i}: {'b' * 1000}\r\n" for i in range(15))
    request = f"GET /healthz HTTP/1.1\r\nHost: gateway\r\n{fits}Connection: close\r\n\r\n"
    assert raw_exchange(hostile.port, request.encode())[0] == 200


def test_an_unparsable_request_is_a_json_400(hostile):
    status, headers, body = raw_exchange(hostile.port, b"GARBAGE\x00 / HTTP/1.1\r\n\r\n")
    assert status == 400
    assert headers["content-type"] == "application/json"
    assert error_of(body)["code"] == "bad_http"


def test_requests_in_progress_are_bounded_with_a_json_503(hostile):
    limit = LIMITS["max_requests_in_progress"]
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Length: 1000\r\n"
        f"Authorization: {AUTH['Authorization']}\r\nContent-Type: application/json\r\n\r\n"
    ).encode()
    held = [socket.create_connection(("127.0.0.1", hostile.port)) for _ in range(limit)]
    try:
        for sock in held:  # each body stays short of its length: the request is in progress
            sock.sendall(head + b'{"model": ')

        def refused() -> bool:
            return httpx.get(hostile.url + "/v1/models", headers=AUTH).status_code == 503

        assert wait_until(refused, 30, 0.05)
        busy = httpx.get(hostile.url + "/v1/models", headers=AUTH)
        assert busy.status_code == 503
        assert busy.headers["retry-after"] == "1"
        error = busy.json()["error"]
        assert error["code"] == "overloaded"
        assert f"the gateway's limit is {limit}" in error["message"]
    finally:
        for sock in held:
            sock.close()
    ok = lambda: httpx.get(hostile.url + "/v1/models", headers=AUTH).status_code == 200  # noqa: E731
    assert wait_until(ok, 30, 0.05)
