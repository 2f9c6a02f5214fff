"""Hostile videos through the chat route (tiny Qwen3-VL gateway, its real decode pool): a
corrupt file, a non-video, a stream that lies about its length and each `video_*` bound are
a 400 in OpenAI's error shape naming the part and the setting; the gateway answers the
next request. No pod is needed: every case is refused before routing."""

from __future__ import annotations

import dataclasses
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from iris.models import load_adapter
from tests.fixtures.videos import encode_video, source_frames
from tests.gateway.helpers import data_url, png_bytes


@pytest.fixture(scope="module")
def gateway_and_client(tiny_qwen3_vl_dir):
    settings = GatewaySettings.load(
        model=str(tiny_qwen3_vl_dir),
        llm_addresses=["127.0.0.1:9"],
        encoder_addresses=["127.0.0.1:9"],
        cache_address="127.0.0.1:9",
        video_max_groups=6,
        allow_remote_images=True,
        remote_image_hosts=["127.0.0.1"],
    )
    gateway = Gateway(settings, load_adapter(tiny_qwen3_vl_dir))
    # Loopback serves the remote cases; production allows public addresses only.
    gateway.prompts.fetcher.address_allowed = lambda address: True
    with TestClient(create_app(settings, gateway)) as client:
        yield gateway, client


def _body(gateway, *urls: str) -> dict:
    parts = [{"type": "video_url", "video_url": {"url": url}} for url in urls]
    content = [{"type": "text", "text": "what happens?"}, *parts]
    return {"model": gateway.model_name, "messages": [{"role": "user", "content": content}]}


def _refused(gateway, client, *urls: str) -> dict:
    response = client.post("/v1/chat/completions", json=_body(gateway, *urls))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"].startswith("messages")
    return error


def _lying_avi() -> bytes:
    """An AVI whose headers declare 4 frames (1 s) but that holds 40."""
    data = bytearray(encode_video(source_frames(40, 64, 32), 4, "mjpeg", "avi"))
    struct.pack_into("<I", data, data.find(b"strh") + 8 + 32, 4)  # strh dwLength
    struct.pack_into("<I", data, data.find(b"avih") + 8 + 16, 4)  # avih dwTotalFrames
    return bytes(data)


MKV = "video/x-matroska"


@pytest.mark.parametrize(
    ("data", "mime", "words"),
    [
        (encode_video(source_frames(8, 64, 32))[:400], MKV, "not a valid video file"),
        (png_bytes(), "video/mp4", "not a supported video container"),
        (b"\x1a\x45\xdf\xa3" + bytes(range(256)) * 4, MKV, "video"),
        (_lying_avi(), "video/avi", "declares 1.0 s but holds a frame"),
    ],
    ids=["truncated", "png-as-video", "garbage-mkv", "lying-length"],
)
def test_a_bad_file_is_a_400(gateway_and_client, data, mime, words):
    gateway, client = gateway_and_client
    error = _refused(gateway, client, data_url(data, mime))
    assert words in error["message"]
    assert error["param"] == "messages[0].content[1]"


SMALL = encode_video(source_frames(16, 64, 32), fps=4)  # 4 s: 8 frames, 4 groups


@pytest.mark.parametrize(
    ("limit", "value", "setting"),
    [
        ("max_bytes", 1000, "video_max_bytes"),
        ("max_duration_s", 2.0, "video_max_duration_s"),
        ("max_frames", 5, "video_max_frames"),
        ("max_frame_pixels", 64 * 32 - 1, "video_max_frame_pixels"),
        ("max_total_pixels", 3 * 64 * 32, "video_max_total_pixels"),
        ("max_groups", 3, "video_max_groups"),
        ("max_decode_s", 1e-9, "video_max_decode_s"),
    ],
)
def test_each_bound_is_a_400_naming_its_setting(gateway_and_client, limit, value, setting):
    gateway, client = gateway_and_client
    decoder = gateway.prompts.videos
    default = decoder.limits
    decoder.limits = dataclasses.replace(default, **{limit: value})
    try:
        error = _refused(gateway, client, data_url(SMALL, MKV))
    finally:
        decoder.limits = default
    assert setting in error["message"], error


def test_a_requests_groups_over_all_its_videos_are_bounded(gateway_and_client):
    """Two 4-group videos: each within video_max_groups (6), together over it."""
    gateway, client = gateway_and_client
    error = _refused(gateway, client, data_url(SMALL, MKV), data_url(SMALL, MKV))
    expected = "request has 8 video frame groups, over the limit of 6 (video_max_groups)"
    assert expected in error["message"]


def test_a_data_video_is_also_bounded_by_the_body_limit(tiny_qwen3_vl_dir):
    settings = GatewaySettings.load(
        model=str(tiny_qwen3_vl_dir),
        llm_addresses=["127.0.0.1:9"],
        encoder_addresses=["127.0.0.1:9"],
        cache_address="127.0.0.1:9",
        max_body_bytes=len(SMALL),  # base64 makes the body larger than the file
    )
    gateway = Gateway(settings, load_adapter(tiny_qwen3_vl_dir))
    with TestClient(create_app(settings, gateway)) as client:
        response = client.post("/v1/chat/completions", json=_body(gateway, data_url(SMALL, MKV)))
    assert response.status_code == 413, response.text


def test_mm_processor_kwargs_stay_refused_by_name(gateway_and_client):
    gateway, client = gateway_and_client
    body = {**_body(gateway, data_url(SMALL, MKV)), "mm_processor_kwargs": {"fps": 4}}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert "mm_processor_kwargs" in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def video_server():
    """Loopback HTTP: /lying.avi (video/avi, a lying AVI), /picture (image/png)."""
    bodies = {"/lying.avi": ("video/avi", _lying_avi()), "/picture": ("image/png", png_bytes())}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            mime, body = bodies[self.path]
            self.send_response(200)
            self.send_header("Content-Type", mime)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_remote_video_is_fetched_under_the_images_rules(gateway_and_client, video_server):
    """A remote video reaches the decoder (its lie is found); a remote answer that is not
    video/* is refused by its Content-Type."""
    gateway, client = gateway_and_client
    error = _refused(gateway, client, video_server + "/lying.avi")
    assert "declares 1.0 s but holds a frame" in error["message"]
    error = _refused(gateway, client, video_server + "/picture")
    assert "not video/*" in error["message"]
