"""What a video costs the gateway (issue 61), on a real `iris gateway` process for tiny
Qwen3-VL with its real decode pool, wired to the scripted pod and encoder and a real cache.

A 2 KB FFV1/MKV file whose two frames lie 299.5 s apart (under the duration limit) is refused
from its header, before any frame is decoded: no decode job runs, no frame is produced, and
neither the gateway nor its workers grow by 100 MB. Two of them in one request likewise; a
third video in a request is refused before anything is read. A 60 s 720p clip is served,
and the gateway's and its workers' peak growth together stays within the bound that
docs/design/multimodal.md ("Video", memory) states, plus 50 MB. Times are printed, never asserted.
"""

from __future__ import annotations

import base64
import concurrent.futures
import threading
import time

import httpx
import numpy as np
import pytest

from iris.models import load_adapter
from iris.up.metrics_page import scrape
from iris.up.processes import free_port, wait_until
from tests.fixtures.videos import encode_video, mux_video, source_frames
from tests.gateway.fake_services import PodScript, serve_encoder, serve_pod
from tests.gateway.gateway_process import start_gateway
from tests.gateway.process_memory import MB, describe, maps_library, peak_growth, tree

pytestmark = pytest.mark.slow

MKV = "video/x-matroska"
CONTEXT = 32768  # room for the 720p clip's 60 groups of 364 tokens
ENCODE_MESSAGE = 3 * MB  # max_encode_message_bytes (the scripted encoder takes 4 MiB): a group each


def sparse_video() -> bytes:
    """Two black 640x640 FFV1 frames at pts 0 and 299.5 s in Matroska (about 2 KB)."""
    black = np.zeros((640, 640, 3), np.uint8)
    return mux_video([(0, black), (599, black)], (640, 640), fps=2, pix_fmt="yuv420p")


def clip_720p(seconds: int = 60, fps: int = 2) -> bytes:
    """A 1280x720 MPEG-4 clip whose every frame differs (a moving gradient): each of the
    grid's frames is a distinct decoded frame."""
    height, width = 720, 1280
    ys, xs = np.mgrid[0:height, 0:width]

    def gradients():
        pixels = np.empty((height, width, 3), np.uint8)
        for k in range(seconds * fps):
            pixels[..., 0] = (xs // 4 + k * 9) % 256
            pixels[..., 1] = (ys // 4 + k * 5) % 256
            pixels[..., 2] = ((xs + ys) // 8 + k * 3) % 256
            yield k, pixels

    return mux_video(
        gradients(),
        (width, height),
        fps,
        "mpeg4",
        pix_fmt="yuv420p",
        codec_options={"qscale": "10"},
    )


@pytest.fixture(scope="module")
def door(tiny_qwen3_vl_dir, cache_process, tmp_path_factory):
    adapter = load_adapter(tiny_qwen3_vl_dir)
    script = PodScript(adapter.fingerprint)
    pod_server, pod_address, pod = serve_pod(script)
    encoder_server, encoder_address, encoder = serve_encoder()
    port, metrics_port = free_port(), free_port()
    env = {
        "IRIS_GATEWAY_MODEL": str(tiny_qwen3_vl_dir),
        "IRIS_GATEWAY_HOST": "127.0.0.1",
        "IRIS_GATEWAY_PORT": str(port),
        "IRIS_GATEWAY_METRICS_PORT": str(metrics_port),
        "IRIS_GATEWAY_LLM_ADDRESSES": pod_address,
        "IRIS_GATEWAY_ENCODER_ADDRESSES": encoder_address,
        "IRIS_GATEWAY_CACHE_ADDRESS": cache_process.cache_address,
        "IRIS_GATEWAY_MAX_MODEL_LEN": str(CONTEXT),
        "IRIS_GATEWAY_MAX_BODY_BYTES": str(8 * MB),
        "IRIS_GATEWAY_MAX_ENCODE_MESSAGE_BYTES": str(ENCODE_MESSAGE),
        "IRIS_GATEWAY_LOAD_POLL_INTERVAL_S": "0.1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    log = tmp_path_factory.mktemp("video-memory") / "gateway.log"
    child, url = start_gateway(env, port, log)
    try:
        door = Door(url, f"http://127.0.0.1:{metrics_port}/metrics", child, tiny_qwen3_vl_dir.name)
        door.encoder, door.script, door.pod = encoder, script, pod
        # A small clip first: the decode pool's process starts and imports what it needs.
        small = encode_video(source_frames(8, 64, 32, seed=61), fps=4)  # 2 s: 2 groups
        response = door.chat(small)
        assert response.status_code == 200, response.text
        # The decode worker: the one process of the gateway's that loaded FFmpeg.
        (door.decoder_pid,) = [pid for pid in tree(child.pid) if maps_library(pid, "libavcodec")]
        assert wait_until(lambda: door.encoded() == 2, 30, 0.05)
        yield door
    finally:
        child.stop()
        pod_server.stop(0)
        encoder_server.stop(0)


def _data_url(data: bytes) -> str:
    return f"data:{MKV};base64," + base64.b64encode(data).decode()


class Door:
    def __init__(self, url: str, metrics: str, child, model: str) -> None:
        self.url, self.metrics, self.child, self.model = url, metrics, child, model

    def chat(self, *videos: bytes) -> httpx.Response:
        parts = [{"type": "video_url", "video_url": {"url": _data_url(data)}} for data in videos]
        content = [{"type": "text", "text": "What happens?"}, *parts]
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 2,
        }
        return httpx.post(self.url + "/v1/chat/completions", json=body, timeout=120)

    def encoded(self) -> int:
        """Items the scripted encoder has been sent (the gateway encodes in the background)."""
        return sum(len(request.items) for request in self.encoder.requests)

    def counters(self) -> dict[str, float]:
        return scrape(self.metrics)

    def inflight_bytes(self) -> float:
        return self.counters().get("iris_gateway_video_inflight_bytes", 0.0)

    def refusals(self, setting: str) -> float:
        return scrape(self.metrics, {"setting": setting}).get(
            "iris_gateway_video_refusals_total", 0.0
        )


def _refused_before_decoding(door: Door, videos: list[bytes], setting: str, label: str):
    before = door.counters()
    refusals = door.refusals(setting)
    pids = tree(door.child.pid)
    started = time.monotonic()
    growth, response = peak_growth(pids, lambda: door.chat(*videos))
    elapsed = time.monotonic() - started
    print(f"\n{label}: {response.status_code} in {elapsed:.3f} s; peak growth {describe(growth)}")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert f"({setting})" in error["message"], error
    after = door.counters()
    for name in ("iris_gateway_video_decodes_total", "iris_gateway_video_frames_decoded_total"):
        assert after.get(name, 0) == before.get(name, 0), name  # no decode job, no frame
    assert door.refusals(setting) == refusals + 1
    assert all(grown < 100 * MB for grown in growth.values()), describe(growth)


def test_a_sparse_2kb_video_is_refused_from_its_header(door):
    data = sparse_video()
    assert len(data) < 2200
    _refused_before_decoding(door, [data], "max_model_len", "one 2 KB video")


def test_two_sparse_videos_are_refused_from_their_headers(door):
    data = sparse_video()
    _refused_before_decoding(door, [data, data], "video_max_groups", "two 2 KB videos")


def test_a_third_video_is_refused_before_any_is_read(door):
    data = sparse_video()
    _refused_before_decoding(door, [data] * 3, "max_videos_per_request", "three 2 KB videos")


def test_a_60s_720p_clip_stays_within_the_stated_bound(door):
    data = clip_720p()
    encoded = door.encoded()

    def served() -> httpx.Response:
        response = door.chat(data)
        # The groups are encoded in the background: the peak counts until the last is sent.
        assert wait_until(lambda: door.encoded() == encoded + 60, 120, 0.05)
        return response

    pids = [door.child.pid, door.decoder_pid]
    started = time.monotonic()
    growth, response = peak_growth(pids, served)
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    # docs/design/multimodal.md, "Video", memory: D distinct frames of W x H x 3 bytes.
    bound = video_bound(120, 832 * 448 * 3, 2, 1280 * 720 * 3, ENCODE_MESSAGE, len(data))
    bound += 50 * MB
    total = sum(growth.values())
    print(
        f"\n60 s 720p: {elapsed:.1f} s; gateway + decode worker peak growth {total / MB:.1f} MB "
        f"(bound {bound / MB:.1f} MB): {describe(growth)}"
    )
    assert total <= bound, describe(growth)


def video_bound(
    distinct: int, frame: int, group: int, source_frame: int, encode_message: int, file: int
) -> int:
    """docs/design/multimodal.md's bound on one video's peak growth, gateway and decode
    worker together: its distinct frames once in each, one source frame being converted and
    the one before it in the worker, one group packed and one Encode message with its
    serialized copy in the gateway, and the file in the gateway and in the two jobs that
    carry it to the worker (header, decode)."""
    return 2 * distinct * frame + group * frame + 2 * source_frame + 2 * encode_message + 3 * file


@pytest.mark.parametrize("stream", [True, False])
def test_a_videos_frames_are_released_while_its_answer_is_generated(door, stream):
    """Once every choice is accepted and its groups are encoded, the request's frames and
    their share of the bound go: `video_inflight_bytes` is back to 0 while the pod still
    generates (it holds the call open after the first token), streamed or whole."""
    data = encode_video(source_frames(8, 64, 32, seed=4 + stream), fps=4)  # 2 s: 2 groups
    encoded = door.encoded()
    requests = len(door.pod.requests)
    gate = door.script.token_gate = threading.Event()
    parts = [{"type": "video_url", "video_url": {"url": _data_url(data)}}]
    body = {
        "model": door.model,
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": 2,
        "stream": stream,
    }
    url = door.url + "/v1/chat/completions"
    try:
        if stream:
            with httpx.stream("POST", url, json=body, timeout=120) as response:
                assert response.status_code == 200, response.read()
                lines = response.iter_lines()
                assert any('"Hello"' in line for line in lines)  # the first token: still open
                _released(door, encoded, gate)
                assert any(line == "data: [DONE]" for line in lines)
            return
        with concurrent.futures.ThreadPoolExecutor(1) as client:
            whole = client.submit(httpx.post, url, json=body, timeout=120)
            assert wait_until(lambda: len(door.pod.requests) > requests, 60, 0.05)
            _released(door, encoded, gate)
            assert whole.result().status_code == 200, whole.result().text
    finally:
        gate.set()
        door.script.token_gate = None


def _released(door: Door, encoded: int, gate: threading.Event) -> None:
    """The groups encoded and the frames' bytes released while the pod holds the answer;
    then the pod goes on."""
    assert wait_until(lambda: door.encoded() == encoded + 2, 60, 0.05)
    assert wait_until(lambda: door.inflight_bytes() == 0, 60, 0.05), door.inflight_bytes()
    gate.set()
