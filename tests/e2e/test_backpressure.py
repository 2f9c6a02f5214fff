"""Backpressure on real multi-process platforms (tiny Qwen2-VL): a full encoder is skipped
for the next, every encoder full is a 429 with the encoders' Retry-After, and a pod that
cannot reach the cache fails the request at once instead of sending it round every pod.

An encoder is made full without racing anything: its queue bound holds fewer vision tokens
than one request's images, so it refuses that request whenever it arrives."""

from __future__ import annotations

import httpx
import pytest

from iris.models import load_adapter
from iris.up.metrics_page import metrics_url, scrape
from iris.up.processes import free_port
from tests.e2e.helpers import image_png
from tests.fixtures.platform import start_platform

pytestmark = pytest.mark.slow
IMAGE_SIZE = (64, 48)


def images_message(seeds) -> list[dict]:
    import base64

    content = [
        {
            "type": "image_url",
            "image_url": {
                "url": "data:image/png;base64,"
                + base64.b64encode(image_png(seed, IMAGE_SIZE)).decode()
            },
        }
        for seed in seeds
    ]
    return [{"role": "user", "content": [*content, {"type": "text", "text": "Compare."}]}]


def chat(platform, messages) -> httpx.Response:
    body = {"model": platform.model_name, "messages": messages, "max_tokens": 2}
    return httpx.post(f"{platform.gateway_url}/v1/chat/completions", json=body, timeout=90)


def queue_bound(tokens: int) -> dict[str, str]:
    return {
        "IRIS_ENCODER_MAX_QUEUE_VISION_TOKENS": str(tokens),
        "IRIS_ENCODER_MAX_ITEM_VISION_TOKENS": str(tokens),
    }


def test_a_full_encoder_is_skipped_and_all_full_is_429_with_retry_after(
    tmp_path, tiny_qwen2_vl_dir
):
    per_image, _ = load_adapter(tiny_qwen2_vl_dir).image_token_count(*IMAGE_SIZE)
    # encoder-0 takes one image at a time, encoder-1 three.
    platform = start_platform(
        tiny_qwen2_vl_dir,
        tmp_path,
        encoders=2,
        extra_env={"encoder-0": queue_bound(per_image), "encoder-1": queue_bound(3 * per_image)},
    )
    try:
        # Two images: too many for encoder-0, whichever encoder a request meets first.
        for request in range(4):
            reply = chat(platform, images_message([100 + 2 * request, 101 + 2 * request]))
            assert reply.status_code == 200, reply.text
        rejected = scrape(metrics_url(platform.service("encoder-0")))
        assert rejected.get("iris_encoder_rejected_total", 0) >= 1  # it was tried, and skipped
        # Four images: too many for both.
        reply = chat(platform, images_message(range(200, 204)))
        assert reply.status_code == 429, reply.text
        assert reply.json()["error"]["code"] == "encoders_full", reply.text
        assert int(reply.headers["retry-after"]) >= 1
        # The refused request left no lease behind: its images encode once room is there.
        reply = chat(platform, images_message([200]))
        assert reply.status_code == 200, reply.text
    finally:
        platform.stop()


def test_a_pod_that_cannot_reach_the_cache_is_a_503_without_trying_every_pod(
    tmp_path, tiny_qwen2_vl_dir
):
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens there
    platform = start_platform(
        tiny_qwen2_vl_dir,
        tmp_path,
        llm_pods=2,
        extra_env={"llm": {"IRIS_LLM_CACHE_ADDRESS": nowhere}},
    )
    try:
        reply = chat(platform, images_message([300]))
        assert reply.status_code == 503, reply.text
        error = reply.json()["error"]
        assert error["code"] == "cache_unavailable", error
        retries = scrape(metrics_url(platform.service("gateway")))
        assert retries.get("iris_gateway_retries_total", 0) == 0  # no second pod was tried
        # Text needs no cache: the pods still serve it.
        assert chat(platform, [{"role": "user", "content": "Hi"}]).status_code == 200
    finally:
        platform.stop()
