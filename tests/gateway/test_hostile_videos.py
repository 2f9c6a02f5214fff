"""Hostile videos through the chat route (tiny Qwen3-VL gateway, its real decode pool): a
corrupt file, a non-video, a stream that lies about its length and each `video_*` bound are
a 400 in OpenAI's error shape naming the part and the setting; the gateway answers the
next request. No pod is needed: every case is refused before routing."""

from __future__ import annotations

import dataclasses
import math
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from gateway.app import create_app
from gateway.auth import key_id
from gateway.intake.video_memory import VideoMemory
from gateway.intake.video_plan import decoded_bytes_bound, plan_video
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from iris.models import load_adapter
from iris.multimodal.video import VideoLimits, probe_video
from tests.fixtures.videos import encode_video, mux_video, source_frames
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
    """Loopback HTTP: /lying.avi (video/avi, a lying AVI), /picture (image/png), /small.mkv
    (SMALL), anything else a 404."""
    bodies = {
        "/lying.avi": ("video/avi", _lying_avi()),
        "/picture": ("image/png", png_bytes()),
        "/small.mkv": (MKV, SMALL),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path not in bodies:
                self.send_error(404)
                return
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


def _chat(gateway, client, url: str):
    return client.post("/v1/chat/completions", json=_body(gateway, url))


def test_a_remote_video_is_fetched_under_the_video_limit(gateway_and_client, video_server):
    """Issue 62: a remote video was read up to the image limit, then refused by the video's.
    Now the fetch itself stops at `video_max_bytes` (a 413 naming it), and the image limit
    does not apply to a video."""
    gateway, client = gateway_and_client
    decoder, fetcher = gateway.prompts.videos, gateway.prompts.fetcher
    default, image_limit = decoder.limits, fetcher.max_bytes
    try:
        decoder.limits = dataclasses.replace(default, max_bytes=1000)
        response = _chat(gateway, client, video_server + "/small.mkv")
        assert response.status_code == 413, response.text
        error = response.json()["error"]
        assert error["message"] == "remote video is over the limit of 1000 bytes (video_max_bytes)"
        assert error["code"] == "video_too_large"
        decoder.limits, fetcher.max_bytes = default, 1000
        response = _chat(gateway, client, video_server + "/small.mkv")
        # Past the fetch and the decode: refused only for want of a pod to route to.
        assert response.status_code == 503, response.text
    finally:
        decoder.limits, fetcher.max_bytes = default, image_limit


def test_fetch_errors_for_a_video_name_a_video(gateway_and_client, video_server):
    gateway, client = gateway_and_client
    error = _refused(gateway, client, video_server + "/missing.mkv")
    assert error["message"] == "video URL answered HTTP 404"
    assert error["code"] == "video_fetch"
    fetcher = gateway.prompts.fetcher
    fetcher.enabled = False
    try:
        error = _refused(gateway, client, video_server + "/small.mkv")
    finally:
        fetcher.enabled = True
    assert error["message"] == "remote video URLs are disabled on this gateway"


def test_a_video_over_the_bytes_in_flight_waits_then_gets_a_503(gateway_and_client):
    """Every byte of the gateway-wide bound is held (by other requests' frames): a video
    waits `video_queue_timeout_s` (0 here), then gets a 503 with Retry-After; no decode."""
    gateway, client = gateway_and_client
    decoder = gateway.prompts.videos
    default = decoder.memory
    decoder.memory = VideoMemory(64 * 1024 * 1024, timeout_s=0, retry_after_s=2)
    decoder.memory.used = decoder.memory.limit
    decodes = _sample("iris_gateway_video_decodes_total")
    try:
        response = _chat(gateway, client, data_url(SMALL, MKV))
    finally:
        decoder.memory = default
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "2"
    assert "(video_queue_timeout_s)" in response.json()["error"]["message"]
    assert _sample("iris_gateway_video_decodes_total") == decodes


def keyed_settings(model_dir, key: str, **extra) -> GatewaySettings:
    """A gateway whose one API key has a prompt-token bucket that does not refill during a
    test (its services unreachable: these requests end at the door or in intake)."""
    return GatewaySettings.load(
        model=str(model_dir),
        llm_addresses=["127.0.0.1:9"],
        encoder_addresses=["127.0.0.1:9"],
        cache_address="127.0.0.1:9",
        api_keys=[key],
        key_prompt_tokens_per_s=0.0001,
        key_prompt_token_burst=100_000,
        **extra,
    )


def test_a_videos_tokens_are_charged_to_its_key_before_the_decode(tiny_qwen3_vl_dir):
    """The key pays the tokens planned from the header before the decode runs: a decode
    that is then refused has still cost them."""
    key = "sk-video-charge"
    # every decode is refused once it runs
    settings = keyed_settings(tiny_qwen3_vl_dir, key, video_max_decode_s=1e-9)
    adapter = load_adapter(tiny_qwen3_vl_dir)
    gateway = Gateway(settings, adapter)
    tokens_per_group, _ = adapter.video_group_token_count(*adapter.video_sampling.resized(64, 32))
    with TestClient(create_app(settings, gateway)) as client:
        response = client.post(
            "/v1/chat/completions",
            json={**_body(gateway, data_url(SMALL, MKV)), "n": 2},
            headers={"Authorization": f"Bearer {key}"},
        )
    assert response.status_code == 400, response.text
    assert "(video_max_decode_s)" in response.json()["error"]["message"]
    left = gateway.key_limits.level(key_id(key), "prompt tokens")
    assert left == pytest.approx(100_000 - 2 * 4 * tokens_per_group, abs=1)


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _bytes_bound(gateway, data: bytes) -> int:
    """What the gateway reserves for `data`'s frames, from its header."""
    prompts = gateway.prompts
    header = probe_video(data, prompts.videos.limits)
    sampling = prompts.adapter.video_sampling
    plan = plan_video(header, "p", prompts.videos.limits, sampling, prompts.adapter)
    return decoded_bytes_bound(plan, prompts.videos.limits, sampling.fps, 1 << 62)


def test_two_videos_over_the_bytes_in_flight_together_are_a_400(gateway_and_client):
    """An idle gateway's bound holds either of a request's videos but not both: they are
    reserved together, so the request is refused at once (a 400 naming the setting), never
    left waiting for frames only it holds; no decode runs."""
    gateway, client = gateway_and_client
    decoder = gateway.prompts.videos
    default = decoder.memory
    data = encode_video(source_frames(8, 64, 32), fps=4)  # 2 s: 2 groups, 4 with its twin
    one = _bytes_bound(gateway, data)
    decoder.memory = VideoMemory(one * 3 // 2, timeout_s=0, retry_after_s=2)
    decodes = _sample("iris_gateway_video_decodes_total")
    try:
        error = _refused(gateway, client, data_url(data, MKV), data_url(data, MKV))
        assert decoder.memory.used == 0
    finally:
        decoder.memory = default
    assert "(video_max_inflight_bytes)" in error["message"], error
    assert f"{one} + {one}" in error["message"], error
    assert _sample("iris_gateway_video_decodes_total") == decodes


def live_video(frames) -> bytes:
    """`frames` as FFV1 in Matroska written as a live stream: no declared duration."""
    size = (frames.shape[2], frames.shape[1])
    return mux_video(enumerate(frames), size, fps=4, container_options={"live": "1"})


def test_a_video_without_a_duration_reserves_a_share_of_the_bound(gateway_and_client):
    """A video that declares no duration reserves at most the bound over
    `max_videos_per_request`, not all of it: with half the bound held by others it is
    decoded at once (its frames fit that share), where the whole bound would wait."""
    gateway, client = gateway_and_client
    data = live_video(source_frames(16, 64, 32))
    assert probe_video(data, VideoLimits()).duration_s is None
    prompts = gateway.prompts
    decoder, default = prompts.videos, prompts.videos.memory
    sampling = prompts.adapter.video_sampling
    frame = 3 * math.prod(sampling.resized(64, 32))
    limit = 2 * prompts.max_videos * 8 * frame  # the share holds the video's 8 frames twice
    assert decoder.limits.max_frames * frame > limit // prompts.max_videos
    decoder.memory = VideoMemory(limit, timeout_s=0, retry_after_s=2)
    decoder.memory.used = limit - limit // prompts.max_videos  # held by other requests
    decodes = _sample("iris_gateway_video_decodes_total")
    try:
        response = _chat(gateway, client, data_url(data, MKV))
    finally:
        decoder.memory = default
    assert "video_queue_timeout_s" not in response.text, response.text
    assert _sample("iris_gateway_video_decodes_total") == decodes + 1


def test_a_video_that_never_decodes_for_a_503_costs_its_key_nothing(tiny_qwen3_vl_dir):
    """The tokens taken before the decode are given back when the request gets a 503
    instead (the bytes in flight stayed full): the work never ran."""
    key = "sk-video-refund"
    settings = keyed_settings(tiny_qwen3_vl_dir, key)
    gateway = Gateway(settings, load_adapter(tiny_qwen3_vl_dir))
    with TestClient(create_app(settings, gateway)) as client:
        memory = gateway.prompts.videos.memory = VideoMemory(1 << 30, timeout_s=0)
        memory.used = memory.limit  # held by other requests' frames
        response = client.post(
            "/v1/chat/completions",
            json={**_body(gateway, data_url(SMALL, MKV)), "n": 2},
            headers={"Authorization": f"Bearer {key}"},
        )
    assert response.status_code == 503, response.text
    assert "(video_queue_timeout_s)" in response.json()["error"]["message"]
    assert gateway.key_limits.level(key_id(key), "prompt tokens") == pytest.approx(100_000, abs=1)
