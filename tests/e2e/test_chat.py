"""End to end on a real multi-process platform (tiny Qwen2-VL): the official openai client
through the gateway to encoder, cache and LLM pod processes on loopback."""

from __future__ import annotations

import http.client
import json

import httpx
import pytest

from iris.up.metrics_page import metrics_url, scrape
from iris.up.processes import wait_until
from tests.e2e.helpers import image_message, image_png

ENCODED = "iris_encoder_images_total"


def encoded_images(platform) -> float:
    return sum(scrape(metrics_url(s)).get(ENCODED, 0.0) for s in platform.by_kind("encoder"))


def aborted(platform) -> float:
    """Requests the LLM pods finished as aborted (their own counter, by reason)."""
    return sum(
        scrape(metrics_url(s), {"reason": "abort"}).get("iris_llm_requests_finished_total", 0.0)
        for s in platform.by_kind("llm")
    )


def running(platform) -> float:
    return sum(
        scrape(metrics_url(s)).get("iris_llm_requests_running", 0.0)
        for s in platform.by_kind("llm")
    )


@pytest.mark.parametrize(
    ("path", "prompt"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count on."}]}),
        ("/v1/completions", {"prompt": "Count on.", "max_tokens": 4000}),
    ],
)
def test_a_client_that_leaves_before_a_whole_answer_stops_its_generation(platform, path, prompt):
    before = aborted(platform)
    # ignore_eos and (nearly) all the 4096-token context. The client leaves as soon as the
    # pod runs the generation (not after a timeout the generation would have to outlast),
    # thousands of tokens before it could end by length.
    body = {"model": platform.model_name, **prompt, "ignore_eos": True, "n": 2}
    host, port = platform.gateway_url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(
            "POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        assert wait_until(lambda: running(platform) >= 1, 60, interval_s=0.01)
    finally:
        connection.close()
    # Both choices end as aborted (not by length, which is where they would otherwise end).
    assert wait_until(lambda: aborted(platform) >= before + 2, 60), aborted(platform) - before


def test_a_client_that_leaves_mid_stream_stops_its_generation(platform):
    before = aborted(platform)
    body = {
        "model": platform.model_name,
        "messages": [{"role": "user", "content": "Count on."}],
        "ignore_eos": True,
        "stream": True,
    }
    url = f"{platform.gateway_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        next(line for line in response.iter_lines() if line.startswith("data: "))
    assert wait_until(lambda: aborted(platform) >= before + 1, 60), aborted(platform) - before


def test_text_chat(platform):
    client = platform.openai_client()
    reply = client.chat.completions.create(
        model=platform.model_name,
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=4,
        temperature=0,
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens >= 1


def test_min_p_one_reaches_the_engine_and_leaves_only_the_top_token(platform):
    """min_p (vLLM's and SGLang's extension) travels gateway → pod → sampler: at 1 only
    the most likely token survives, so sampling at temperature 1 gives the greedy answer."""
    client = platform.openai_client()
    messages = [{"role": "user", "content": "Count with me: one two three"}]

    def answer(**extra):
        reply = client.chat.completions.create(
            model=platform.model_name, messages=messages, max_tokens=12, **extra
        )
        return reply.choices[0].message.content

    greedy = answer(temperature=0)
    assert answer(temperature=1.0, seed=5, extra_body={"min_p": 1.0}) == greedy
    sampled = {answer(temperature=1.0, seed=seed) for seed in range(4)}
    assert sampled != {greedy}  # without min_p these seeds do not all give the greedy answer


def test_same_image_in_two_requests_is_encoded_once(platform):
    client = platform.openai_client()
    png = image_png(seed=101)
    before = encoded_images(platform)
    first = client.chat.completions.create(
        model=platform.model_name, messages=image_message(png), max_tokens=3, temperature=0
    )
    second = client.chat.completions.create(
        model=platform.model_name,
        messages=image_message(png, "Say it again."),
        max_tokens=3,
        temperature=0,
    )
    assert first.usage.prompt_tokens > 20  # the image's tokens are in the prompt
    assert second.usage.prompt_tokens > 20
    assert wait_until(lambda: encoded_images(platform) >= before + 1, 10)
    assert encoded_images(platform) == before + 1


def test_one_trace_spans_every_service(platform, otlp_session_collector):
    client = platform.openai_client()
    client.chat.completions.create(
        model=platform.model_name,
        messages=image_message(image_png(seed=202)),
        max_tokens=2,
        temperature=0,
    )
    wanted = {"iris-gateway", "iris-encoder", "iris-cache", "iris-llm"}

    def llm_fetched_in_trace(spans) -> bool:
        """The LLM pod's embedding fetch (on its fetch thread) is a child of its span."""
        llm_spans = {span.span_id for span in spans if span.service == "iris-llm"}
        return any(
            span.service == "iris-cache" and span.parent_span_id in llm_spans for span in spans
        )

    def a_trace_has_all() -> bool:
        return any(
            wanted <= {span.service for span in spans} and llm_fetched_in_trace(spans)
            for spans in otlp_session_collector.traces().values()
        )

    assert wait_until(a_trace_has_all, 60), {
        trace_id: sorted({s.service for s in spans})
        for trace_id, spans in otlp_session_collector.traces().items()
    }


def test_embedding_reuse_off_encodes_every_request_afresh(platform):
    # The shared platform's second gateway runs with embedding reuse off.
    client = platform.openai_client(gateway=1)
    messages = image_message(image_png(seed=303))
    before = encoded_images(platform)
    replies = [
        client.chat.completions.create(
            model=platform.model_name, messages=messages, max_tokens=2, temperature=0
        )
        for _ in range(2)
    ]
    assert wait_until(lambda: encoded_images(platform) >= before + 2, 10)
    assert encoded_images(platform) == before + 2
    # Same image, same text: only the image spans differ, so the text before them is
    # still a prefix hit but the image tokens are not.
    assert (
        replies[1].usage.prompt_tokens_details.cached_tokens < replies[1].usage.prompt_tokens - 10
    )


def test_image_chat_on_a_local_redis_cluster(tmp_path, tiny_qwen2_vl_dir):
    """`iris up --cache redis-cluster`: three local masters; the image's embedding goes
    through the cluster store and the second request reuses it."""
    from tests.fixtures.platform import start_platform

    on_cluster = start_platform(tiny_qwen2_vl_dir, tmp_path, cache="redis-cluster")
    try:
        assert len(on_cluster.by_kind("redis")) == 3
        client = on_cluster.openai_client()
        png = image_png(seed=404)
        for text in ("Describe it.", "Say it again."):
            reply = client.chat.completions.create(
                model=on_cluster.model_name,
                messages=image_message(png, text),
                max_tokens=2,
                temperature=0,
            )
            assert reply.usage.prompt_tokens > 20
        assert encoded_images(on_cluster) == 1
        from embedding_cache_svc.client import CacheClient

        with CacheClient(on_cluster.cache_address, bytes(32)) as cache:
            stats = cache.stats()
        assert stats["store"] == "redis-cluster" and stats["entries"] >= 1
    finally:
        on_cluster.stop()
