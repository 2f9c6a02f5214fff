"""Fault tests on real multi-process platforms (tiny Qwen2-VL): a killed encoder, Redis
stopped under load, a killed LLM pod. Faults may degrade service — a request may fail, with
a clean OpenAI-style error — but never hang, and the gateway stays healthy throughout."""

from __future__ import annotations

import json
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from iris.up.metrics_page import metrics_url, scrape
from iris.up.processes import wait_until
from tests.e2e.helpers import image_message, image_png, internal_details_in
from tests.fixtures.platform import POD_HEADER, start_platform

pytestmark = pytest.mark.slow
DEADLINE_S = 90.0  # no request may take longer: "none hang"


def chat(platform, messages, max_tokens=2, **extra) -> httpx.Response:
    body = {
        "model": platform.model_name,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }
    return httpx.post(f"{platform.gateway_url}/v1/chat/completions", json=body, timeout=DEADLINE_S)


def assert_clean(response: httpx.Response, platform) -> None:
    """A success, or an error with an OpenAI error body — never a bare crash — that names
    no pod address, Redis host or gRPC detail (those are in the gateway's log)."""
    if response.status_code != 200:
        error = response.json()["error"]
        assert error["message"] and error["type"], response.text
        assert not internal_details_in(response.text, platform), response.text


def gateway_healthy(platform) -> bool:
    return httpx.get(f"{platform.gateway_url}/healthz", timeout=5).status_code == 200


def test_encoder_killed_mid_batch(tmp_path, tiny_qwen2_vl_dir):
    platform = start_platform(
        tiny_qwen2_vl_dir,
        tmp_path,
        encoders=2,
        extra_env={"gateway": {"IRIS_GATEWAY_LEASE_MS": "3000"}},
    )
    try:
        images = [image_png(seed=1000 + i, size=(256, 192)) for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(chat, platform, image_message(png)) for png in images]
            platform.service("encoder-0").child.kill()
            responses = [future.result(timeout=DEADLINE_S + 10) for future in futures]
        for response in responses:
            assert response.status_code in (200, 503), response.text
            assert_clean(response, platform)
        assert gateway_healthy(platform)
        # The surviving encoder serves new images.
        fresh = chat(platform, image_message(image_png(seed=1999)))
        assert fresh.status_code == 200, fresh.text
    finally:
        platform.stop()


def test_redis_stopped_under_load_then_refilled(tmp_path, tiny_qwen2_vl_dir):
    platform = start_platform(tiny_qwen2_vl_dir, tmp_path, cache="redis")
    try:
        assert chat(platform, image_message(image_png(seed=2000))).status_code == 200
        platform.service("redis").child.kill()
        with ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(chat, platform, image_message(image_png(seed=2001 + i)))
                for i in range(4)
            ]
            futures.append(pool.submit(chat, platform, [{"role": "user", "content": "Hi"}]))
            responses = [future.result(timeout=DEADLINE_S + 10) for future in futures]
        for response in responses:
            assert_clean(response, platform)
        assert responses[-1].status_code == 200  # text needs no cache
        assert gateway_healthy(platform)

        platform.restart("redis")
        cache_metrics = metrics_url(platform.service("cache"))

        def refilled() -> bool:
            reply = chat(platform, image_message(image_png(seed=2100)))
            return reply.status_code == 200

        assert wait_until(refilled, 30, interval_s=1.0)
        assert scrape(cache_metrics).get("iris_cache_bytes_stored", 0) > 0
    finally:
        platform.stop()


def test_llm_pod_killed_mid_stream(tmp_path, tiny_qwen2_vl_dir):
    platform = start_platform(
        tiny_qwen2_vl_dir, tmp_path, llm_pods=2, extra_env={"gateway": POD_HEADER}
    )
    try:
        body = {
            "model": platform.model_name,
            "messages": [{"role": "user", "content": "Count for a long while."}],
            "max_tokens": 4000,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        events = []
        with httpx.stream(
            "POST", f"{platform.gateway_url}/v1/chat/completions", json=body, timeout=DEADLINE_S
        ) as response:
            assert response.status_code == 200
            pod = response.headers["x-iris-pod"]
            victim = next(s for s in platform.by_kind("llm") if s.address == pod)
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[len("data: ") :])
                if len(events) == 2:
                    # Frozen first: the generation cannot finish before the kill lands.
                    victim.child.signal_group(signal.SIGSTOP)
                    victim.child.kill()
        assert events[-1] != "[DONE]" or any("error" in json.loads(e) for e in events[:-1])
        assert any(e != "[DONE]" and "error" in json.loads(e) for e in events), events[-3:]
        errors = [e for e in events if e != "[DONE]" and "error" in json.loads(e)]
        assert not internal_details_in(" ".join(errors), platform), errors
        assert gateway_healthy(platform)
        # Requests not yet accepted go to the surviving pod.
        for i in range(3):
            reply = chat(platform, [{"role": "user", "content": f"Hello {i}"}])
            assert reply.status_code == 200, reply.text
            assert reply.headers["x-iris-pod"] != pod
    finally:
        platform.stop()
