"""Tiny Qwen3-VL and tiny Qwen3.5 (its vision tower without deepstack, the hybrid decoder)
under the platform `iris up` runs (real cache, encoder, pod and gateway processes): an image
chat through the gateway, then the same image again. The entry holds the main embedding and
every deepstack level (Qwen3-VL: two; Qwen3.5: none); the second request is answered from
it (the encoder encodes nothing, the pod's fetch is a cache hit) and answers the same.

The pod's prefix cache is off here, so the second request must read the embedding cache
rather than resume from its own KV pages."""

from __future__ import annotations

import pytest

from embedding_cache_svc.client import CacheClient
from iris.models import load_adapter
from iris.up.metrics_page import metrics_url, scrape
from tests.e2e.helpers import image_message, image_png
from tests.fixtures.platform import QWEN3_VL_ENV, start_platform

pytestmark = pytest.mark.slow


@pytest.fixture
def qwen3_5_vl_platform(tmp_path, tiny_qwen3_5_vl_dir):
    """Tiny Qwen3.5 set as the session's tiny Qwen3-VL platform (used by this test only)."""
    running = start_platform(tiny_qwen3_5_vl_dir, tmp_path, extra_env=QWEN3_VL_ENV)
    yield running
    running.stop()


@pytest.mark.parametrize(
    ("platform_name", "levels"), [("platform_qwen3_vl", 2), ("qwen3_5_vl_platform", 0)]
)
def test_the_same_image_again_is_read_from_the_cache_and_answered_the_same(
    request, platform_name, levels
):
    # Qwen3-VL's platform is shared (the video tests use it): counts are differences.
    platform = request.getfixturevalue(platform_name)
    adapter = load_adapter(platform.model_dir)
    size = (64, 96)
    client = platform.openai_client()
    messages = image_message(image_png(seed=4747, size=size))

    def chat():
        reply = client.chat.completions.create(
            model=platform.model_name, messages=messages, max_tokens=6, temperature=0
        )
        return reply.choices[0].message.content, reply.usage

    def counters():
        encoder = scrape(metrics_url(platform.by_kind("encoder")[0]))
        cache = scrape(metrics_url(platform.service("cache")))
        return encoder.get("iris_encoder_images_total", 0), cache

    def stats():
        with CacheClient(platform.cache_address, bytes(32)) as client_of_cache:
            return client_of_cache.stats()

    encoded_before, cache_before = counters()
    hits_before = cache_before.get("iris_cache_hits_total", 0)
    discards = cache_before.get("iris_cache_validation_discards_total", 0)
    stats_before = stats()
    first, usage = chat()
    assert usage.completion_tokens > 0 and usage.prompt_tokens > 16, usage
    encoded, cache = counters()
    assert encoded == encoded_before + 1, (encoded_before, encoded)
    hits = cache.get("iris_cache_hits_total", 0)
    assert hits == hits_before + 1, cache  # the pod read the entry the encoder stored
    # The entry holds the main rows and every deepstack level (float32).
    tokens, _ = adapter.image_token_count(*size)
    assert adapter.deepstack_levels == levels
    assert adapter.embedding_width == (1 + levels) * adapter.hidden_size
    stored = stats()
    assert stored["entries"] == stats_before["entries"] + 1, (stats_before, stored)
    added = stored["bytes"] - stats_before["bytes"]
    assert added >= tokens * adapter.embedding_width * 4, (stats_before, stored, tokens)

    second, _ = chat()
    encoded_again, cache = counters()
    assert encoded_again == encoded  # no encode: the entry was there
    assert cache.get("iris_cache_hits_total", 0) == hits + 1, cache
    assert cache.get("iris_cache_validation_discards_total", 0) == discards, cache
    assert second == first
